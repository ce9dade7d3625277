"""Make the `kernels` package load Hub kernels through kerneld, so code written for it, and
Transformers' `from_pretrained(..., use_kernels=True)`, get one download per host, a zero-network
warm start, the verified store and node-wide denies without changing a line.

    from kerneld_client.integrations import kernels as kerneld_kernels
    kerneld_kernels.install()          # or KERNELD_HOOK_KERNELS=1 before the interpreter starts

How: every name of the release's public API (`kernels.__all__`: 34 names in 0.17.2, 38 in
0.18.3 and 0.19.1) is bound, in the `kernels` module itself, to its `kerneld_client` namesake
(`_kernels_names.SERVED`), which has the same signature and meaning. `kernels`' private modules
are neither read nor changed, so a release that reorganises them (0.19 moved every one under
`kernels._internals`) is served the same way; the `kernels` command line stays `kernels`' own
(the start-up hook does not bind in it). Code that looks the names up after the hook ran
(`from kernels import get_kernel`, `kernels.kernelize(...)`: Transformers does) gets kerneld's;
the hook runs right after `import kernels` finishes, before anyone else can look.

Which releases: 0.17.2 to 0.19.x are tested; a later 0.x is served when every name of its
`__all__` is one kerneld serves. Anything else (older than 0.17.2, 1.0 or later, a name kerneld
does not serve) gets one KerneldHookWarning saying what the job gets instead, and `kernels` is
left as it is.

What a routed call does when kerneld cannot provide the kernel is kerneld_client's fallback
policy, with `hub` as the default in a hooked process (`kernels` would download from the Hub):
$KERNELD_FALLBACK `hub` (default here) downloads and verifies it in-process from `HF_ENDPOINT`;
`torch` raises the typed error at once (a FileNotFoundError); `error` (or KERNELD_REQUIRE=1)
raises the typed error. A denied kernel, or one with no build for this platform, is never
downloaded. `kernelize` keeps the PyTorch forward of a layer whose kernel cannot be had (a repo
that is missing, denied, unreachable, whose publisher cannot be checked, a daemon that is
down) with one KernelFallbackWarning per repo; a repo whose publisher is untrusted, a version or
revision that does not exist, still raise as in `kernels`.
"""

from __future__ import annotations

import re
import threading
import warnings
from types import ModuleType
from typing import Any

from kerneld_client import _config
from kerneld_client.integrations import _kernels_names
from kerneld_client.integrations._hook_warning import KerneldHookWarning

__all__ = ["TESTED", "KerneldHookWarning", "install", "installed", "recognised", "uninstall"]

TESTED = ">=0.17.2,<0.20"
"""The `kernels` releases the hook is tested with (0.17.2, 0.18.3, 0.19.1)."""
_LOWEST = (0, 17, 2)
_TESTED_BELOW = (0, 20)
_BELOW = (1, 0)


class _State:
    """The hook as installed: the module, its release, and the values it replaced."""

    __slots__ = ("module", "originals", "version")

    def __init__(self, module: ModuleType, version: str, originals: dict[str, Any]) -> None:
        self.module = module
        self.version = version
        self.originals = originals


_lock = threading.RLock()  # reentrant: `import kernels` below may run the start-up hook
_state: _State | None = None
_refused = False  # install() said no, with its one warning


def _release(version: str) -> tuple[int, int, int] | None:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def recognised(version: str) -> bool:
    """Whether `version` (kernels.__version__) is one the hook may serve (0.17.2 to 0.x)."""
    parts = _release(version)
    return parts is not None and _LOWEST <= parts < _BELOW


def instead() -> str:
    """What a job whose `kernels` is not hooked gets: `kernels`' own code, from HF_ENDPOINT."""
    endpoint = _config.hf_endpoint()
    if endpoint:
        return (
            f"kernels' own code downloads from HF_ENDPOINT={endpoint} (where that is kerneld's "
            "Hub endpoint, the host's store serves it, without the warm index path and kerneld's "
            "fallback rules; a missing kernel or a stopped daemon fails there as on the Hub)"
        )
    return (
        "kernels' own code downloads from the Hugging Face Hub, without kerneld (set "
        "HF_ENDPOINT to kerneld's Hub endpoint to serve it from the host's store)"
    )


def _refuse(reason: str) -> bool:
    global _refused
    message = f"kerneld: {reason}; the kernels hook is off: {instead()}"
    if not _refused:
        warnings.warn(message, KerneldHookWarning, stacklevel=3)
    _refused = True
    _config.log.debug("%s", message)
    return False


def installed() -> bool:
    """Whether `kernels` is routed through kerneld in this process."""
    return _state is not None


def _loggers(version: tuple[int, int, int]) -> dict[str, str]:
    """The logger names `kernels` writes its records to (the version notice, the
    kernel_condition skip), so that the hook's records go where `kernels`' would."""
    prefix = "kernels._internals" if version >= (0, 19, 0) else "kernels"
    return {"versions": f"{prefix}._versions", "kernelize": f"{prefix}.layer.kernelize"}


def install() -> bool:
    """Route the `kernels` package through kerneld in this process; True if it is (now or
    already). Never raises: a release it cannot serve gets one KerneldHookWarning."""
    global _state
    with _lock:
        if _state is not None:
            return True
        try:
            import kernels
        except Exception as exc:
            return _refuse(f"cannot import the kernels package ({exc!r})")
        if _state is not None:  # that import ran the start-up hook, which installed it
            return True
        version = str(getattr(kernels, "__version__", "unknown"))
        parts = _release(version)
        if parts is None or not _LOWEST <= parts < _BELOW:
            return _refuse(
                f"kernels {version} is not a release the kerneld hook serves "
                f"(0.17.2 to 0.x; tested: {TESTED})"
            )
        public = getattr(kernels, "__all__", None)
        if not isinstance(public, list | tuple) or not all(isinstance(n, str) for n in public):
            return _refuse(f"kernels {version} has no list of public names (__all__)")
        missing = _kernels_names.unserved(list(public))
        if missing:
            return _refuse(
                f"kernels {version} has public names kerneld does not serve ({', '.join(missing)})"
            )
        try:
            names = _kernels_names.bound_names(list(public))
            bound = {name: _kernels_names.implementation(name) for name in names}
        except Exception as exc:  # a broken kerneld_client install
            return _refuse(f"kerneld_client could not provide kernels' public names ({exc!r})")
        originals = {name: kernels.__dict__.get(name) for name in bound}
        for name, value in bound.items():
            setattr(kernels, name, value)
        _state = _State(kernels, version, originals)
        _config.set_hooked(_loggers(parts))
        _config.log.debug("kernels %s: its %d public names are kerneld's", version, len(bound))
        _attach_diffusers()
        return True


def _attach_diffusers() -> None:
    """Diffusers' hub attention backends ask the Hub about the publisher before `get_kernel`:
    with `get_kernel` kerneld's, that question is kerneld's too (integrations/diffusers.py)."""
    try:
        from kerneld_client.integrations import diffusers

        diffusers.attach()
    except Exception as exc:  # the kernels hook stands; Diffusers keeps its own Hub check
        _config.log.warning("kerneld could not attach to diffusers (%r)", exc)


def uninstall() -> None:
    """Give `kernels` its own public names back."""
    global _state
    with _lock:
        state = _state
        if state is None:
            return
        from kerneld_client.integrations import diffusers

        diffusers.detach()
        for name, original in state.originals.items():
            setattr(state.module, name, original)
        _state = None
        _config.set_hooked(None)
