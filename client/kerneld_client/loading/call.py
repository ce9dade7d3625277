"""One loading call as the caller sees it: the memo, one flight per kernel, then the
fallback policy on failure.

A repeated call with the same request and options returns the memoised module. Concurrent
calls for the same kernel share one load (`SingleFlight`); calls for different kernels do not
wait for each other. (The loader used to hold one process-wide lock across a whole daemon
fetch, up to `KERNELD_FETCH_TIMEOUT`, so a kernel being downloaded stopped every other thread's
load, warm ones included.) The fallback policy is applied per caller, after the shared load,
since each caller may pass its own `fallback=` object and policy.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from kerneld_client import _config
from kerneld_client._loads import MEMO
from kerneld_client._types import KernelRequest
from kerneld_client.errors import KernelError
from kerneld_client.loading.context import LoadContext, LoadOptions, as_kernel_error
from kerneld_client.loading.loaded import LoadedKernel
from kerneld_client.loading.pipeline import load
from kerneld_client.platform import current_platform
from kerneld_client.single_flight import SingleFlight

if TYPE_CHECKING:
    from kerneld_client.loading.fallback import FallbackPolicy

#: (request's fields, backend, options, LOCAL_KERNELS folder) -> what the first successful load
#: of it gave; shared with the warm fast path (`_loads`, `_warm`), which keys its loads alike.
_memo = MEMO
_flights: SingleFlight[Hashable, LoadedKernel | KernelError] = SingleFlight()


def _local_override(request: KernelRequest) -> str:
    """The `LOCAL_KERNELS` folder named for the repo now ("" for none). Part of the memo's key:
    `kernels` reads `LOCAL_KERNELS` on every call, so a call after it changed loads what it
    names now (or fails as that folder does), not what an earlier call loaded."""
    if not _config.raw(_config.ENV_LOCAL_KERNELS):  # one environment lookup when unused
        return ""
    from kerneld_client.loading.local import local_overrides

    path = local_overrides().get(request.repo_id)
    return "" if path is None else str(path)


def run(
    request: KernelRequest,
    *,
    backend: str | None,
    options: LoadOptions,
    fallback: object,
    policy: str | FallbackPolicy | None,
    hub_allowed: bool,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> Any:
    """The kernel's module, or what the fallback policy makes of the failure."""
    chosen = _config.fallback_policy(policy)  # ValueError for a bad name: a usage error
    platform = current_platform(backend)  # ValueError for a bad backend, as in `kernels`
    key = (*_request_key(request), backend, *options.memo_key(), _local_override(request))
    memo = _memo.get(key)
    if memo is not None:
        return memo.module
    outcome = _flights.do(key, lambda: _load_once(key, request, LoadContext(platform, options)))
    if isinstance(outcome, LoadedKernel):
        return outcome.module
    return failed(
        outcome,
        request,
        key,
        LoadContext(platform, options),
        fallback=fallback,
        policy=chosen,
        hub_allowed=hub_allowed,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )


def _request_key(request: KernelRequest) -> tuple[object, ...]:
    return (request.repo_id, request.version, request.revision, request.locked_commit)


def failed(
    outcome: KernelError,
    request: KernelRequest,
    key: tuple[object, ...],
    ctx: LoadContext,
    *,
    fallback: object,
    policy: str,
    hub_allowed: bool,
    trust_remote_code: bool | list[str],
    user_agent: str | dict[str, str] | None,
) -> Any:
    """What the fallback policy makes of a failed load (a fallback that loads is memoised)."""
    from kerneld_client.loading.fallback import fall_back

    return fall_back(
        outcome,
        request,
        ctx,
        fallback=fallback,
        policy=policy,
        hub_allowed=hub_allowed,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
        remember=lambda loaded: _memo.setdefault(key, loaded),
    )


def failed_import(
    error: KernelError,
    request: KernelRequest,
    *,
    backend: str | None,
    options: LoadOptions,
    fallback: object,
    policy: str | FallbackPolicy | None,
    trust_remote_code: bool | list[str],
    user_agent: str | dict[str, str] | None,
) -> Any:
    """A kernel whose own code failed in the warm fast path's import: what `run` does with that
    failure (the kernel is not imported a second time)."""
    chosen = _config.fallback_policy(policy)
    platform = current_platform(backend)
    key = (*_request_key(request), backend, *options.memo_key(), _local_override(request))
    return failed(
        error,
        request,
        key,
        LoadContext(platform, options),
        fallback=fallback,
        policy=chosen,
        hub_allowed=True,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )


def _load_once(
    key: tuple[object, ...], request: KernelRequest, ctx: LoadContext
) -> LoadedKernel | KernelError:
    """The load, or its failure as a typed error (returned: each caller applies its own
    fallback to it)."""
    memo = _memo.get(key)  # a flight that just ended may have answered it
    if memo is not None:
        return memo
    try:
        loaded = load(request, ctx)
    except Exception as exc:
        return as_kernel_error(exc, request)
    _memo[key] = loaded
    return loaded
