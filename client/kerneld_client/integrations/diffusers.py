"""Diffusers' Hub attention backends through kerneld: the publisher question is the site's,
answered where the kernel is loaded, not by a Hub request from every job.

Diffusers 0.42 (`diffusers.models.attention_dispatch`) loads the kernel of a `*_hub` backend
(`flash_hub`, `flash_varlen_hub`, `_flash_3_hub`, `sage_hub`...) with `kernels.get_kernel`,
after asking the Hub itself whether the repo's organisation is a trusted kernel publisher
(`huggingface_hub.get_organization_overview`) unless HF_HUB_OFFLINE or
DIFFUSERS_TRUST_REMOTE_KERNELS is set, and the latter also becomes `trust_remote_code=True`. So a
warm job still sends the Hub one request per backend, fails when the Hub is unreachable, and the
variable makes kerneld trust any publisher.

Under the `kernels` hook the `get_kernel` Diffusers calls is kerneld's, which refuses a kernel
whose publisher the site's `[trust]` policy does not trust, for the exact repo (`[trust] allow`
and signed mirror imports name repos, so an answer per organisation would be wrong either way):
from the verdicts the daemon publishes on a warm host (no request at all), from the daemon
otherwise. While the hook is installed this module rebinds two names of attention_dispatch, and
nothing else of Diffusers:

- `get_organization_overview`: answers without a request that the publisher's trust is decided
  by kerneld at the load that follows (`trustedKernelPublisher` True, `kerneldVerdict` saying
  so); when the hook is uninstalled, huggingface_hub's comes back.
- `DIFFUSERS_TRUST_REMOTE_KERNELS`: False. It is Diffusers' switch for its own Hub check; it
  must not make kerneld trust a publisher the site does not (a site that trusts one lists it
  under `[trust] allow`). A process that sets it gets one KerneldHookWarning saying so.

The kernels hook attaches this right after it is installed: at once when attention_dispatch is
already imported, else when it is (a finder waits for that import). A Diffusers release without
these names (before 0.42 there was no check) is left as it is.
"""

from __future__ import annotations

import sys
import threading
import warnings
from types import ModuleType
from typing import Any

from kerneld_client import _config
from kerneld_client.integrations._after_import import AfterImport
from kerneld_client.integrations._hook_warning import KerneldHookWarning

__all__ = ["TARGET", "TESTED", "KerneldOverview", "attach", "attached", "detach"]

TARGET = "diffusers.models.attention_dispatch"
TESTED = "0.42.1"
"""The Diffusers release whose hub backends are tested through the hook."""
_OVERVIEW = "get_organization_overview"
_TRUST_ENV = "DIFFUSERS_TRUST_REMOTE_KERNELS"
_SENTINEL = object()


class KerneldOverview:
    """What Diffusers reads of huggingface_hub's organisation overview, answered by kerneld:
    the trust of `name`'s kernels is the site's, applied by the `get_kernel` that follows."""

    __slots__ = ("kerneldVerdict", "name", "trustedKernelPublisher")

    def __init__(self, name: str) -> None:
        self.name = name
        # camelCase: the Hub's field, which Diffusers reads with getattr
        self.trustedKernelPublisher = True
        self.kerneldVerdict = "decided by the site's [trust] policy when kerneld loads the kernel"

    def __repr__(self) -> str:
        return f"KerneldOverview({self.name!r}: {self.kerneldVerdict})"


class _Attached:
    __slots__ = ("module", "originals")

    def __init__(self, module: ModuleType, originals: dict[str, Any]) -> None:
        self.module = module
        self.originals = originals


_lock = threading.RLock()
_attached: _Attached | None = None
_warned_env = False


def attached() -> bool:
    """Whether attention_dispatch's publisher question is kerneld's in this process."""
    return _attached is not None


def _overview_from(original: Any) -> Any:
    """attention_dispatch's `get_organization_overview` while attached (`original`, which
    detach() puts back, is huggingface_hub's)."""

    def get_organization_overview(organization: str, *args: Any, **kwargs: Any) -> Any:
        _config.log.debug(
            "diffusers asked whether %s is a trusted kernel publisher: kerneld's load decides",
            organization,
        )
        return KerneldOverview(organization)

    get_organization_overview.__wrapped__ = original  # type: ignore[attr-defined]
    return get_organization_overview


def _warn_env_ignored() -> None:
    global _warned_env
    if _warned_env:
        return
    _warned_env = True
    warnings.warn(
        f"kerneld: {_TRUST_ENV} is set, but under kerneld it does not trust a kernel publisher: "
        "the site's [trust] policy decides (an admin trusts one with `allow` under [trust] in "
        "kerneld.toml)",
        KerneldHookWarning,
        stacklevel=4,
    )


def _patch(module: ModuleType) -> None:
    global _attached
    with _lock:
        if _attached is not None:
            return
        original = module.__dict__.get(_OVERVIEW, _SENTINEL)
        trust_env = module.__dict__.get(_TRUST_ENV, _SENTINEL)
        if not callable(original) or not isinstance(trust_env, bool):
            _config.log.debug(
                "diffusers' attention_dispatch has no publisher check kerneld knows; left as is"
            )
            return
        originals = {_OVERVIEW: original, _TRUST_ENV: trust_env}
        setattr(module, _OVERVIEW, _overview_from(original))
        setattr(module, _TRUST_ENV, False)
        _attached = _Attached(module, originals)
        _config.log.debug("diffusers' hub attention backends: publisher trust is kerneld's")
        if trust_env:
            _warn_env_ignored()


class _AttentionDispatchFinder(AfterImport):
    """Waits for `import diffusers.models.attention_dispatch`, then attaches."""

    target = TARGET

    def then(self) -> None:
        try:
            module = sys.modules.get(TARGET)
            if module is not None:
                _patch(module)
        except Exception as exc:  # never break Diffusers' import
            _config.log.warning("kerneld could not attach to diffusers (%r)", exc)


def attach() -> None:
    """Answer Diffusers' publisher question from kerneld's verdict: now if attention_dispatch is
    imported, else when it is. The kernels hook calls this once it is installed."""
    with _lock:
        module = sys.modules.get(TARGET)
        if module is not None:
            _patch(module)
        elif "diffusers" in sys.modules or _diffusers_installed():
            _AttentionDispatchFinder().insert()


def _diffusers_installed() -> bool:
    """Whether `import diffusers` could succeed (no import: a finder only where it is)."""
    from importlib.util import find_spec

    try:
        return find_spec("diffusers") is not None
    except (ImportError, ValueError):
        return False


def detach() -> None:
    """Give attention_dispatch its own names back and stop waiting for its import."""
    global _attached
    with _lock:
        for finder in [f for f in sys.meta_path if isinstance(f, _AttentionDispatchFinder)]:
            finder.remove()
        state = _attached
        if state is None:
            return
        for name, value in state.originals.items():
            setattr(state.module, name, value)
        _attached = None
