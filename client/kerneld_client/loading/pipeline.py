"""The sources in order, each candidate through `materialize`: local override, published
index, daemon. Raises the typed KernelError of the last stage tried; never falls back (that is
`call`'s job, after the memo).

The index answers warm loads without any RPC. A miss, or a tree collected between the read and
the lock, asks the daemon, coalesced with the other processes of this user missing the same
kernel. An index answer older than `KERNELD_REF_MAX_AGE` is re-checked with the daemon first and
loaded as it is only when the daemon cannot be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerneld_client import _config
from kerneld_client._types import KernelRequest
from kerneld_client.errors import DaemonUnavailable, KernelUnavailable
from kerneld_client.loading.context import LoadContext
from kerneld_client.loading.loaded import LoadedKernel
from kerneld_client.loading.materialize import dependency_requests, materialize
from kerneld_client.loading.published import PublishedIndexSource
from kerneld_client.loading.sources import Candidate, TreeVanished

if TYPE_CHECKING:
    from kerneld_client.loading.sources import DependencyLoader


def load(request: KernelRequest, ctx: LoadContext) -> LoadedKernel:
    """Load `request` (a kernel asked for by the caller, or a dependency of one)."""
    ctx = ctx.entering(request.repo_id)
    if _config.raw(_config.ENV_LOCAL_KERNELS):  # the local source costs nothing when unused
        from kerneld_client.loading.local import LocalSource

        local = LocalSource().find(request, ctx)
        if local is not None:
            return load_candidate(local, ctx)
    index = PublishedIndexSource()
    stale: Candidate | None = None
    candidate = index.find(request, ctx)
    if candidate is not None and candidate.stale:
        stale = candidate  # older than KERNELD_REF_MAX_AGE: the daemon re-checks the ref
    elif candidate is not None:
        try:
            return load_candidate(candidate, ctx)
        except TreeVanished:
            pass
    try:
        return _ask_daemon(request, ctx, index, coalesce=stale is None and ctx.options.allow_fetch)
    except DaemonUnavailable:
        if stale is None:
            raise
        try:
            return load_candidate(stale, ctx)
        except TreeVanished:
            raise KernelUnavailable(
                "the ref's tree is being removed and kerneld is unavailable",
                repo_id=request.repo_id,
                revision=request.ref,
            ) from None


def load_candidate(candidate: Candidate, ctx: LoadContext) -> LoadedKernel:
    """`materialize` with the candidate's dependencies loaded the way its source says."""
    return materialize(candidate, ctx, _dependencies(candidate, ctx))


def _dependencies(candidate: Candidate, ctx: LoadContext) -> DependencyLoader:
    resolved = candidate.dependencies
    if resolved is not None:  # the daemon's answer: its dependencies, in its order
        return lambda _metadata: {d.request.repo_id: _daemon_tree(d, ctx).module for d in resolved}
    return lambda metadata: {
        dep.repo_id: load(dep, ctx).module
        for dep in dependency_requests(metadata, ctx, candidate.request)
    }


def _ask_daemon(
    request: KernelRequest, ctx: LoadContext, index: PublishedIndexSource, *, coalesce: bool
) -> LoadedKernel:
    from kerneld_client.loading.daemon import CoalescedDaemonSource, DaemonSource

    daemon = DaemonSource(index)
    candidate = (CoalescedDaemonSource(daemon) if coalesce else daemon).find(request, ctx)
    if candidate.source == "index":  # another process asked; its answer is in the index now
        try:
            return load_candidate(candidate, ctx)
        except TreeVanished:
            candidate = daemon.find(request, ctx)
    return _daemon_tree(candidate, ctx)


def _daemon_tree(candidate: Candidate, ctx: LoadContext) -> LoadedKernel:
    try:
        return load_candidate(candidate, ctx)
    except TreeVanished as exc:
        from kerneld_client.loading.daemon import vanished

        raise vanished(candidate, exc) from exc
