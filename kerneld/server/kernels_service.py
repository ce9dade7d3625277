"""The `Kernels` service on the user socket: read-only RPCs any training process may call.

"Read-only" for the caller: a Resolve may download a missing kernel, but only where the
daemon's fetch policy allows it, and it never changes pins, denies or config.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import grpc

from kerneld import __version__
from kerneld.server import convert
from kerneld.server.core import Core, Served
from kerneld.server.errors import abort, classify
from kerneld.store import client_index
from kerneld_client._convert import facts_to_proto
from kerneld_client._proto import kerneld_pb2 as pb
from kerneld_client._proto import kerneld_pb2_grpc as pb_grpc

log = logging.getLogger("kerneld.kernels")


def daemon_status(core: Core) -> pb.DaemonStatus:
    """What GetStatus (and GetAdminStatus) report; works before the store is open."""
    cfg = core.config
    status = pb.DaemonStatus(
        version=__version__,
        ready=core.ready,
        store_root=str(cfg.store_path),
        index_path=str(cfg.store_path / "index" / f"v{client_index.VERSION}"),
        index_format=client_index.VERSION,
        started_at=convert.ts(core.started_at),
        store_cap_bytes=cfg.cap_bytes or 0,
    )
    if core.ready:
        usage = core.store.usage()
        status.trees = usage.trees
        status.blobs = usage.blobs
        status.store_bytes = usage.bytes_used
        status.index_path = str(core.store.layout.client_index)
    for up in core.upstreams:
        item = pb.UpstreamStatus(
            name=up.name,
            kind=up.kind,
            location=up.location,
            priority=up.priority,
            reachable=up.reachable,
            last_error=up.last_error,
        )
        if up.last_success is not None:
            item.last_success.CopyFrom(convert.ts(up.last_success))
        status.upstreams.append(item)
    if core.hardware is not None:
        torch = core.prefetcher.configured_torch if core.ready else ()
        status.host_platforms.extend(facts_to_proto(f) for f in core.hardware.platforms(torch))
    return status


class KernelsService(pb_grpc.KernelsServicer):
    def __init__(self, core: Core) -> None:
        self.core = core
        self.facts = convert.FactsCache()
        self.metadata = convert.MetadataCache()

    def _served(self, request: pb.ResolveRequest) -> Served:
        spec = convert.spec_from_ref(request.kernel)
        facts = self.facts.get(request.platform, request.HasField("platform"))
        return self.core.resolve(
            spec,
            facts,
            allow_fetch=request.allow_fetch,
            variant=request.variant,
            lease_s=request.lease_seconds,
            holder=request.client,
        )

    def _to_proto(self, served: Served) -> pb.ResolvedKernel:
        """The wire form: built once per remembered resolution, then copied with this call's
        leases filled in."""
        template = served.memo.get("proto")
        if not isinstance(template, pb.ResolvedKernel):
            template = convert.resolved_to_proto(
                served.resolution, {}, cached=self.core.cached_variants, metadata=self.metadata
            )
            served.memo["proto"] = template
        out = pb.ResolvedKernel()
        out.CopyFrom(template)
        convert.set_leases(out, served.resolution, served.leases)
        return out

    def _failed(
        self, method: str, exc: BaseException, request: pb.ResolveRequest | None = None
    ) -> pb.ErrorDetail:
        kernel = request.kernel if request is not None else pb.KernelRef()
        failure = classify(exc, repo=kernel.repo_id)
        self.core.metrics.errors.labels(method, pb.ErrorCode.Name(failure.detail.code)).inc()
        log.info(
            "%s failed repo=%s selector=%s code=%s: %s",
            method,
            kernel.repo_id or "-",
            kernel.WhichOneof("selector") or "main",
            pb.ErrorCode.Name(failure.detail.code),
            failure.detail.message,
        )
        return failure.detail

    def Resolve(
        self, request: pb.ResolveRequest, context: grpc.ServicerContext
    ) -> pb.ResolveResponse:
        try:
            kernel = self._to_proto(self._served(request))
        except Exception as exc:
            self._failed("Resolve", exc, request)
            abort(context, exc, repo=request.kernel.repo_id)
        return pb.ResolveResponse(kernel=kernel)

    def _one(self, request: pb.ResolveRequest) -> pb.ResolveResult:
        try:
            return pb.ResolveResult(kernel=self._to_proto(self._served(request)))
        except Exception as exc:
            return pb.ResolveResult(error=self._failed("ResolveMany", exc, request))

    def ResolveMany(
        self, request: pb.ResolveManyRequest, context: grpc.ServicerContext
    ) -> pb.ResolveManyResponse:
        requests = list(request.requests)
        if len(requests) <= 1:
            return pb.ResolveManyResponse(results=[self._one(r) for r in requests])
        # Misses download in parallel (each kernel is single-flight on its own).
        futures: list[Future[pb.ResolveResult]] = [
            self.core.pool.submit(self._one, r) for r in requests
        ]
        return pb.ResolveManyResponse(results=[f.result() for f in futures])

    def ListVariants(
        self, request: pb.ListVariantsRequest, context: grpc.ServicerContext
    ) -> pb.ListVariantsResponse:
        try:
            spec = convert.spec_from_ref(request.kernel)
            facts = self.facts.get(request.platform, request.HasField("platform"))
            commit, stale, decisions = self.core.list_variants(
                spec, facts, allow_fetch=request.allow_fetch
            )
            cached = self.core.cached_variants(spec.repo_id, commit)
        except Exception as exc:
            self._failed("ListVariants", exc)
            abort(context, exc, repo=request.kernel.repo_id)
        return pb.ListVariantsResponse(
            repo_id=spec.repo_id,
            commit=commit,
            stale=stale,
            variants=convert.decisions_to_proto(decisions, cached),
        )

    def RenewLease(self, request: pb.RenewLeaseRequest, context: grpc.ServicerContext) -> pb.Lease:
        try:
            lease = self.core.renew_lease(request.lease_id, request.lease_seconds)
        except Exception as exc:
            self._failed("RenewLease", exc)
            abort(context, exc)
        return pb.Lease(id=lease.id, expires_at=convert.ts(lease.expires_at))

    def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseLeaseResponse:
        try:
            self.core.release_lease(request.lease_id)
        except Exception as exc:
            self._failed("ReleaseLease", exc)
            abort(context, exc)
        return pb.ReleaseLeaseResponse()

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.DaemonStatus:
        try:
            return daemon_status(self.core)
        except Exception as exc:
            self._failed("GetStatus", exc)
            abort(context, exc)
