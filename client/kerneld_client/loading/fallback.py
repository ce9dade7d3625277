"""What a failed load becomes: the `hub` fallback, the caller's `fallback=` object, or the
typed error (`policy`, `KERNELD_FALLBACK`, `KERNELD_REQUIRE=1`).

Imported only when a load failed. A denial or "no variant fits this platform" is final: the
Hub would say the same or, worse, serve what the admin refused.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from typing import Any

from kerneld_client import _config
from kerneld_client._types import KernelRequest
from kerneld_client.errors import (
    DependencyMissing,
    KernelDenied,
    KernelError,
    NoCompatibleVariant,
    RevisionNotFound,
)
from kerneld_client.loading.context import MISSING, LoadContext, as_kernel_error
from kerneld_client.loading.hub_fallback import HubSource
from kerneld_client.loading.loaded import LoadedKernel
from kerneld_client.loading.materialize import dependency_requests, materialize
from kerneld_client.loading.pipeline import load
from kerneld_client.single_flight import SingleFlight


class FallbackPolicy(str, enum.Enum):
    """What to do when the kernel cannot be had through kerneld (`_config.FALLBACK_POLICIES`)."""

    TORCH = "torch"  # return the caller's fallback object, or raise the typed error
    HUB = "hub"  # download it in-process from the Hub (verified), then as TORCH
    ERROR = "error"  # raise the typed error


_hub_flights: SingleFlight[Hashable, LoadedKernel] = SingleFlight()


def fall_back(
    error: KernelError,
    request: KernelRequest,
    ctx: LoadContext,
    *,
    fallback: object,
    policy: str,
    hub_allowed: bool,
    trust_remote_code: bool | list[str],
    user_agent: str | dict[str, str] | None,
    remember: Callable[[LoadedKernel], object],
) -> Any:
    """The module the caller gets instead, or raise (`error`, or the Hub's own failure).
    `policy`: a name `_config.fallback_policy` checked."""
    what = f"{request.repo_id}@{request.ref}"
    policy = FallbackPolicy(policy)
    if _config.require() or policy is FallbackPolicy.ERROR:
        raise error
    # Final: the admin's deny, no build for this platform, and what the daemon learnt from the
    # upstream (no such revision, an untrusted publisher), a Python dependency this job lacks:
    # the Hub would say the same, or serve what the admin refused.
    final_terms = isinstance(
        error, KernelDenied | NoCompatibleVariant | RevisionNotFound | DependencyMissing
    )
    if policy is FallbackPolicy.HUB and hub_allowed and not final_terms:
        from kerneld_client import _hub_download

        if _hub_download.available():
            hub = HubSource(trust_remote_code=trust_remote_code, user_agent=user_agent)
            try:
                loaded = _hub_flights.do(
                    (request, ctx.facts, *ctx.options.memo_key()),
                    lambda: load_from_hub(request, ctx, hub),
                )
            except Exception as exc:
                hub_error = as_kernel_error(exc, request)
                hub_error.__context__ = error
                error = hub_error
            else:
                remember(loaded)
                _config.warn_once(
                    request.repo_id,
                    f"kerneld could not provide kernel {what} ({error.message}); "
                    "loaded it directly from the Hub",
                )
                return loaded.module
    if fallback is MISSING:
        raise error
    _config.warn_once(
        request.repo_id, f"cannot load kernel {what} ({error.message}); using the fallback"
    )
    return fallback


def load_from_hub(request: KernelRequest, ctx: LoadContext, hub: HubSource) -> LoadedKernel:
    """The kernel from the Hub; its dependencies from kerneld when it can, else the Hub too."""
    ctx = ctx.entering(request.repo_id)
    candidate = hub.find(request, ctx)

    def dependencies(metadata: Any) -> dict[str, Any]:
        modules = {}
        for dep in dependency_requests(metadata, ctx, request):
            try:
                modules[dep.repo_id] = load(dep, ctx).module
            except KernelError:
                modules[dep.repo_id] = load_from_hub(dep, ctx, hub).module
        return modules

    return materialize(candidate, ctx, dependencies)
