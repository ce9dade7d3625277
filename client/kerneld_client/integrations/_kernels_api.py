"""The parts of the `kernels` package the hook reads, and whether the hook is installed.

`install()` looks them up once (`KernelsApi`: an ImportError or AttributeError there means a
`kernels` whose internals this hook does not know, and no hook). The replacements read the
installed `HookState` at each call, so one that a caller bound before `uninstall()` runs kernels'
own function from then on.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["HookState", "KernelsApi", "installed_state", "set_installed_state"]


class KernelsApi:
    """The parts of `kernels` the hook reads, looked up once (AttributeError: not as expected)."""

    def __init__(self) -> None:
        resolver = importlib.import_module("kernels.resolver")
        validate = importlib.import_module("kernels.validate")
        rust = importlib.import_module("kernels._rust")
        kimporter = importlib.import_module("kernels.importer")
        hf_hub = importlib.import_module("kernels.hf_hub")
        self.SequentialResolver: Any = resolver.SequentialResolver
        self.NoopResolver: Any = resolver.NoopResolver
        self.RepoPathsResolver: Any = resolver.RepoPathsResolver
        self.HubResolver: Any = resolver.HubResolver
        self.HubCacheResolver: Any = resolver.HubCacheResolver
        self.LockedHubResolver: Any = resolver.LockedHubResolver
        self.LockedHubCacheResolver: Any = resolver.LockedHubCacheResolver
        self.AllValidator: Any = validate.AllValidator
        self.ArchValidator: Any = validate.ArchValidator
        self.Version: Any = rust.KernelVersion.Version
        self.Revision: Any = rust.KernelVersion.Revision
        self.Metadata: Any = rust.Metadata
        self.LoadedKernel: Any = kimporter.LoadedKernel
        self.registry: dict[Path, Any] = kimporter._loaded_kernels
        self.RepoInfo: Any = hf_hub.RepoInfo


class HookState:
    """The hook as installed: the `kernels` parts it reads, and the functions it replaced."""

    __slots__ = ("api", "originals")

    def __init__(self, api: KernelsApi) -> None:
        self.api = api
        self.originals: dict[tuple[str, str], Any] = {}


_state: HookState | None = None


def installed_state() -> HookState | None:
    """The state of the installed hook, or None when `kernels` runs on its own."""
    return _state


def set_installed_state(state: HookState | None) -> None:
    """Record the hook as installed with `state` (install()), or as gone (None: uninstall())."""
    global _state
    _state = state
