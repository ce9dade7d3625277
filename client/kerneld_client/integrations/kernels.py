"""Make the `kernels` package load Hub kernels through kerneld, so code written for it, and
Transformers' `from_pretrained(..., use_kernels=True)`, get one download per host, a zero-network
warm start, the verified store and node-wide denies without changing a line.

    from kerneld_client.integrations import kernels as kerneld_kernels
    kerneld_kernels.install()          # or KERNELD_HOOK_KERNELS=1 before the interpreter starts

Where it hooks (kernels >=0.17.2,<0.18, checked; anything else: one warning, no hook):
- `get_kernel_with_resolver` in `kernels.load`, `kernels.layer.layer` and `kernels.layer.func`:
  every Hub load funnels through it (get_kernel, get_locked_kernel, load_kernel,
  LayerRepository/FuncRepository loads, LockedLayerRepository/LockedFuncRepository);
- `select_revision_or_version` in `kernels.layer.layer` and `kernels.layer.func`: how a
  LayerRepository turns `version=N` into a commit (a Hub refs request in `kernels`);
- `has_kernel` (public names in `kernels` and `kernels.load`: it has no inner funnel, so a caller
  that bound it before install() keeps the original).
The first two are module globals looked up at call time: callers that imported `kernels.get_kernel`
before the hook (Transformers does) are routed too, and kernels' own layer machinery (mappings,
modes, `kernelize` fallbacks) is untouched. Local kernels (`LOCAL_KERNELS`, `get_local_kernel`,
`LocalLayerRepository`) and resolvers this module does not know stay with `kernels`.

A routed load is what `kerneld_client.get_kernel` does (published index, else the daemon; store
trust checks; arch check before import; kernel-depends; bytecode never written into the store),
then kernels' own metadata validators (python-depends, kernels_minver, dirty build; the arch one
excepted, kerneld did it) and registration in `kernels.get_loaded_kernels()`. Publisher trust is
the daemon's (`[trust]`, the same rule as kernels'): the call's `trust_remote_code` goes with the
request, and a refusal is kernels' own `ValueError`.

When kerneld cannot provide the kernel, $KERNELD_FALLBACK decides (one KernelFallbackWarning per
repository and process):
- unset or `hub`: kernels' own code runs, unchanged (it may download from the Hub); if it fails
  on the network or the Hub too, KernelUnavailable (so a layer mapped to a repo nobody has keeps
  PyTorch instead of failing the model load);
- `torch`: KernelUnavailable (a FileNotFoundError: `kernelize` keeps the PyTorch forward, and
  nothing touches the Hub);
- `error`, or KERNELD_REQUIRE=1: the typed error.
A kernel the administrator denied, or that has no build for this platform, is never handed to
`kernels` (that would bypass the deny): KernelDenied / NoCompatibleVariant, both FileNotFoundError.

This module is the switch (install, uninstall, the version gate). The replacements are in
`_kernels_wrappers`, what they decide (kerneld or `kernels`, and the fallback) in
`_kernels_routing`, and the parts of `kernels` they read, with the installed state, in
`_kernels_api`.
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
import warnings
from typing import Any

from kerneld_client import _config
from kerneld_client.integrations._kernels_api import (
    HookState,
    KernelsApi,
    installed_state,
    set_installed_state,
)
from kerneld_client.integrations._kernels_wrappers import FACTORIES, MARK

__all__ = ["RECOGNISED", "KerneldHookWarning", "install", "installed", "uninstall"]

RECOGNISED = ">=0.17.2,<0.18"
"""The `kernels` versions whose internals this hook knows (0.17.2 is what it is tested with)."""
_LOWEST = (0, 17, 2)
_BELOW = (0, 18)

# (module, attribute) replaced by install() (the factory of each replacement: FACTORIES[attribute])
_POINTS: tuple[tuple[str, str], ...] = (
    ("kernels.load", "get_kernel_with_resolver"),
    ("kernels.layer.layer", "get_kernel_with_resolver"),
    ("kernels.layer.func", "get_kernel_with_resolver"),
    ("kernels.layer.layer", "select_revision_or_version"),
    ("kernels.layer.func", "select_revision_or_version"),
    # Only the name the layer repositories call: a load for a layer (see _kernels_wrappers).
    ("kernels.layer.layer", "get_kernel"),
    ("kernels.layer.func", "get_kernel"),
    ("kernels.load", "has_kernel"),
    ("kernels", "has_kernel"),
)


class KerneldHookWarning(RuntimeWarning):
    """The hook was not installed; `kernels` works as usual, without kerneld."""


_lock = threading.RLock()  # reentrant: `import kernels` below may run the start-up hook
_refused = False  # install() said no, with its one warning


def _refuse(message: str) -> bool:
    global _refused
    if not _refused:
        warnings.warn(message, KerneldHookWarning, stacklevel=3)
    _refused = True
    _config.log.debug("%s", message)
    return False


def recognised(version: str) -> bool:
    """Whether `version` (kernels.__version__) is in RECOGNISED."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return False
    parts = tuple(int(p) for p in match.groups())
    return _LOWEST <= parts < _BELOW


def installed() -> bool:
    """Whether `kernels` is routed through kerneld in this process."""
    return installed_state() is not None


def install() -> bool:
    """Route the `kernels` package through kerneld in this process; True if it is (now or
    already). Never raises: an unknown `kernels` gets one KerneldHookWarning and no hook."""
    with _lock:
        if installed_state() is not None:
            return True
        try:
            import kernels
        except Exception as exc:
            return _refuse(f"kerneld: cannot import the kernels package ({exc!r}); nothing hooked")
        if installed_state() is not None:  # that import ran the start-up hook, which installed it
            return True
        version = str(getattr(kernels, "__version__", "unknown"))
        if not recognised(version):
            return _refuse(
                f"kerneld: kernels {version} is not a version the kerneld hook knows "
                f"({RECOGNISED}); kernels works as usual, without kerneld"
            )
        try:
            api = KernelsApi()
            modules = {name: importlib.import_module(name) for name, _ in _POINTS}
            state = HookState(api)
            for name, attr in _POINTS:
                current = getattr(modules[name], attr)
                while getattr(current, MARK, False):  # wrapped by another copy of this hook
                    current = current.__wrapped__
                if not callable(current):
                    raise AttributeError(f"{name}.{attr} is not callable")
                state.originals[(name, attr)] = current
        except (ImportError, AttributeError) as exc:
            return _refuse(
                f"kerneld: kernels {version} does not look as the kerneld hook expects ({exc}); "
                "kernels works as usual, without kerneld"
            )
        # One wrapper per original, so `kernels.has_kernel is kernels.load.has_kernel` stays.
        wrappers: dict[int, Any] = {}
        for (name, attr), original in state.originals.items():
            if id(original) not in wrappers:
                wrappers[id(original)] = FACTORIES[attr](original)
            setattr(modules[name], attr, wrappers[id(original)])
        set_installed_state(state)
        _config.log.debug("kernels %s now resolves through kerneld", version)
        return True


def uninstall() -> None:
    """Give `kernels` its own functions back."""
    with _lock:
        state = installed_state()
        if state is None:
            return
        for (name, attr), original in state.originals.items():
            module = sys.modules.get(name)
            if module is not None and getattr(getattr(module, attr, None), MARK, False):
                setattr(module, attr, original)
        set_installed_state(None)
