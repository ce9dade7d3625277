"""The daemon as a source: one Resolve RPC, and one ask per kernel per host when cold.

Imported only on a miss of the published index (it is where grpc gets imported, in `_rpc`).
The daemon answers with store trees by digest, dependencies first; the answer becomes
candidates under this process's view of the store root, wherever the daemon sees the store
(a container may mount it elsewhere). `CoalescedDaemonSource` makes the other processes of
this user that miss the same kernel at the same moment wait for the first one's answer and
read it from the index instead of each asking (`_coalesce`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerneld_client import _config, locations, published_index
from kerneld_client._types import KernelRequest
from kerneld_client.errors import DaemonUnavailable, KernelError, KernelUnavailable, UntrustedPath
from kerneld_client.loading.context import LoadContext
from kerneld_client.loading.published import PublishedIndexSource, forget_versions
from kerneld_client.loading.sources import Candidate

if TYPE_CHECKING:
    from kerneld_client import _path_trust
    from kerneld_client._rpc import Resolved


class DaemonSource:
    """Ask kerneld over its socket; it fetches what its store lacks unless told not to."""

    def __init__(self, index: PublishedIndexSource) -> None:
        self.index = index

    def find(self, request: KernelRequest, ctx: LoadContext) -> Candidate:
        """The daemon's answer (never None: the daemon's refusals are typed errors)."""
        from kerneld_client import _rpc

        forget_versions(request.repo_id)  # the daemon may publish the repo's versions now
        try:
            resolved = _rpc.resolve(
                locations.default_socket(),
                request,
                ctx.platform.raw,
                allow_fetch=ctx.options.allow_fetch,
                trust_remote_code=ctx.options.trusts(request.repo_id),
            )
        except KernelError:
            raise
        except ImportError as exc:  # grpc or protobuf missing or broken
            raise DaemonUnavailable(
                f"cannot talk to kerneld: {exc}", repo_id=request.repo_id
            ) from exc
        # The daemon answered, so its store exists now (it may have just been created).
        self.index.refresh()
        if self.index.root is None:
            raise UntrustedPath(
                "kerneld returned a path, but this process does not know the store root",
                repo_id=request.repo_id,
                hint="set KERNELD_STORE, or let kerneld write its advert beside the socket",
            )
        return _candidate(self.index.root, resolved, request)


class CoalescedDaemonSource:
    """Ask the daemon, unless another process of this user is asking it for the same kernel
    right now: then wait for that answer and take it from the index it published."""

    def __init__(self, daemon: DaemonSource) -> None:
        self.daemon = daemon

    def find(self, request: KernelRequest, ctx: LoadContext) -> Candidate:
        from kerneld_client import _coalesce  # the cold path only

        socket_path = locations.default_socket()
        with _coalesce.turn(socket_path, request, _config.fetch_timeout_s()) as ask:
            if ask:
                return self.daemon.find(request, ctx)
        index = self.daemon.index
        index.refresh()
        candidate = index.find(request, ctx)
        if candidate is not None and not candidate.stale:
            return candidate
        return self.daemon.find(request, ctx)


def _candidate(
    root: _path_trust.StoreRoot, resolved: Resolved, request: KernelRequest
) -> Candidate:
    """A daemon answer as candidates: its dependencies, in the daemon's order, then itself."""
    dependencies = tuple(
        _candidate(root, dep, KernelRequest(dep.repo_id, revision=dep.ref or dep.commit))
        for dep in resolved.dependencies
    )
    try:
        lock = published_index.lock_path_for(root.real_path, resolved.digest)
        tree = published_index.tree_relpath_for(resolved.path, resolved.digest)
    except published_index.IndexFormatError as exc:
        # Whatever answered on the socket did not name a tree of the store by its digest.
        raise UntrustedPath(f"kerneld's answer refused: {exc}", repo_id=request.repo_id) from exc
    return Candidate(
        request=request,
        source="daemon",
        path=tree,  # under this process's store root, wherever the daemon sees the store
        variant=resolved.variant,
        commit=resolved.commit,
        digest=resolved.digest,
        root=root,
        lock=lock,
        dependencies=dependencies,
    )


def vanished(candidate: Candidate, exc: Exception) -> KernelUnavailable:
    """What a tree the daemon named but this process cannot find means for the job."""
    root, tree = candidate.root, candidate.path
    assert root is not None  # the daemon names store trees
    if not (root.real_path / tree.parent).is_dir():
        return KernelUnavailable(
            f"kerneld answered with a tree of its store, but {root.path} (this process's "
            f"store root) holds no {tree.parent}/: the daemon's store is not there",
            repo_id=candidate.request.repo_id,
            hint="mount the host's store at that path (read-only is fine), or point "
            "KERNELD_STORE at it (docs/containers.md)",
        )
    return KernelUnavailable(
        f"the tree kerneld returned disappeared: {exc}", repo_id=candidate.request.repo_id
    )
