"""The `Kernels` service on the user socket: read-only RPCs any training process may call.

"Read-only" for the caller: a Resolve may download a missing kernel, but only where the
daemon's fetch policy allows it, and it never changes pins, denies or config. A ReportSuspect
only asks for a re-check: the daemon takes a tree out of service on its own finding, never on
the caller's word (suspect.py).

A call that may download is answered within the caller's gRPC deadline whatever the upstreams
do: the work runs on a worker thread, and when the deadline is near the caller gets
UPSTREAM_UNAVAILABLE naming every upstream and what it said so far, while the fetch goes on
(single-flight, bounded by the retry budgets) for the callers that come after.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any, NoReturn, TypeVar

import grpc

from kerneld import __version__
from kerneld.server.fronts.rpc import convert, suspect
from kerneld.server.fronts.rpc.hosts import KernelsHost, StatusHost
from kerneld.server.plumbing import identity, logs
from kerneld.server.services.bounds import clip
from kerneld.server.services.serving import Served
from kerneld.server.statuses import abort, classify, log_level, rpc_handler
from kerneld.store import InvalidInputError, published_index
from kerneld.upstream.errors import UpstreamPending
from kerneld.upstream.retry import recent_failure
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto import kerneld_pb2_grpc as pb_grpc
from kerneld_client.wire import facts_to_proto

log = logging.getLogger("kerneld.kernels")
T = TypeVar("T")

#: The answer leaves this long before the caller's deadline (at most a quarter of the time
#: left), so that it arrives as an answer and not as DEADLINE_EXCEEDED.
ANSWER_MARGIN_S = 0.25
#: Calls that may download, run at once on the service's workers; more wait their turn (and
#: are answered at their deadline all the same).
BOUNDED_WORKERS = 8
#: A deadline further away than this is treated as none (grpc reports "none" as a huge one).
NO_DEADLINE_S = 10 * 86400.0
#: GetStatus shows at most this much of an upstream's last error.
MAX_STATUS_ERROR = 1024
#: Handlers whose failures are logged where they are handled (the suspect desk writes one line
#: per report): `fail` only counts them.
_LOGGED_ELSEWHERE = frozenset({"ReportSuspect"})


def _selector(kernel: pb.KernelRef) -> str:
    """The ref a KernelRef asks for, as errors name it (`v1`, a branch, a commit)."""
    which = kernel.WhichOneof("selector")
    if which == "version":
        return f"v{kernel.version}"
    return str(getattr(kernel, which)) if which else "main"


def _shown(location: str) -> str:
    """An upstream's location without credentials (`https://user:token@host` -> `https://host`)."""
    return logs.redact(location)


def daemon_status(core: StatusHost) -> pb.DaemonStatus:
    """What GetStatus (and GetAdminStatus) report; works before the store is open."""
    cfg = core.config
    status = pb.DaemonStatus(
        version=__version__,
        ready=core.ready,
        store_root=str(cfg.store_path),
        index_path=str(cfg.store_path / "index" / f"v{published_index.VERSION}"),
        index_format=published_index.VERSION,
        started_at=convert.ts(core.started_at),
        store_cap_bytes=cfg.cap_bytes or 0,
        hub_api=core.hub_api,
        listener_problems=core.listener_problems,
        import_only=cfg.import_only,
    )
    if core.ready:
        usage = core.space.usage()
        status.trees = usage.trees
        status.blobs = usage.blobs
        status.store_bytes = usage.bytes_used
        status.index_path = str(core.published.directory)
    for up in core.upstreams:
        item = pb.UpstreamStatus(
            name=_shown(up.name),
            kind=up.kind,
            location=_shown(up.location),
            priority=up.priority,
            reachable=up.reachable,
            # Any user may ask: an upstream's credentials (URL userinfo, tokens) never show.
            last_error=clip(logs.redact(up.last_error), MAX_STATUS_ERROR),
        )
        if up.last_success is not None:
            item.last_success.CopyFrom(convert.ts(up.last_success))
        status.upstreams.append(item)
    if core.hardware is not None:
        torch = core.prefetcher.configured_torch if core.ready else ()
        status.host_platforms.extend(facts_to_proto(f) for f in core.hardware.platforms(torch))
    return status


class KernelsService(pb_grpc.KernelsServicer):
    def __init__(self, core: KernelsHost) -> None:
        self.core = core
        self.facts = convert.FactsCache()
        self.metadata = convert.MetadataCache()
        # One worker per RPC thread: each waits on at most one resolution at a time.
        workers = max(BOUNDED_WORKERS, core.config.threads)
        self._bounded = ThreadPoolExecutor(workers, thread_name_prefix="resolve-fetch")
        self.suspects = suspect.SuspectDesk(core)

    # ---- answers within the caller's deadline -------------------------------------------------

    @staticmethod
    def _answer_by(context: grpc.ServicerContext) -> float | None:
        """Monotonic time by which the caller must have its answer; None without a deadline."""
        remaining = context.time_remaining()
        if remaining is None or remaining > NO_DEADLINE_S:
            return None
        return time.monotonic() + remaining - min(ANSWER_MARGIN_S, remaining / 4)

    def _start(self, fn: Callable[[], T], by: float | None) -> Future[T]:
        """Run `fn` on a worker when it must end by a deadline, else here and now."""
        if by is not None:  # the caller's identity (server/plumbing/identity.py) goes along
            return self._bounded.submit(contextvars.copy_context().run, fn)
        future: Future[T] = Future()
        try:
            future.set_result(fn())
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _finish(
        self, future: Future[T], by: float | None, started: float, kernel: pb.KernelRef
    ) -> T:
        """`future`'s result, or UpstreamPending at `by` (the work goes on without the caller)."""
        if by is not None:
            wait([future], timeout=max(0.0, by - time.monotonic()))
            if not future.done():
                if not future.cancel():
                    future.add_done_callback(self._abandoned)
                raise self._pending(started, kernel)
        return future.result()

    def _pending(self, started: float, kernel: pb.KernelRef) -> UpstreamPending:
        """Every upstream and what it said since this call began (its last failed attempt)."""
        said = []
        for up in self.core.upstreams:
            where = f"{up.name} ({_shown(up.location)})" if up.location else up.name
            failure = recent_failure(up.name, started)
            said.append(
                f"{where}: {failure} (still retrying)" if failure else f"{where}: no answer yet"
            )
        waited = time.monotonic() - started
        return UpstreamPending(
            f"not in this host's store, and no upstream provided it within the caller's deadline "
            f"({waited:.1f}s; the download goes on for later calls): " + "; ".join(said),
            repo_id=kernel.repo_id,
            revision=_selector(kernel),
        )

    def _abandoned(self, future: Future[Any]) -> None:
        """A resolution finished after its caller left: give back the leases taken for it."""
        if future.cancelled() or future.exception() is not None:
            return
        served = future.result()
        if isinstance(served, Served):
            for lease in served.leases.values():
                try:
                    self.core.serving.release_lease(lease.id)
                except Exception as exc:  # expired or the store closing: it expires on its own
                    log.debug("releasing lease %s of a departed caller: %r", lease.id, exc)

    # ---- resolution ---------------------------------------------------------------------------

    def _remembered(self, request: pb.ResolveRequest) -> Served | None:
        """A warm answer, here and now (no thread hop for the common case); None: resolve."""
        convert.check_resolve(request)
        spec = convert.spec_from_ref(request.kernel)
        facts = self.facts.get(request.platform, request.HasField("platform"))
        return self.core.serving.resolve_remembered(
            spec,
            facts,
            allow_fetch=request.allow_fetch,
            variant=request.variant,
            lease_s=request.lease_seconds,
            holder=request.client,
            trust_remote_code=request.trust_remote_code,
        )

    def _served(self, request: pb.ResolveRequest, *, asked: bool = False) -> Served:
        """Resolve with the daemon's policy; `asked`: `_remembered` checked the request and
        found no remembered answer just now."""
        if not asked:
            convert.check_resolve(request)
        spec = convert.spec_from_ref(request.kernel)
        facts = self.facts.get(request.platform, request.HasField("platform"))
        return self.core.serving.resolve(
            spec,
            facts,
            allow_fetch=request.allow_fetch,
            variant=request.variant,
            lease_s=request.lease_seconds,
            holder=request.client,
            caller=identity.current(),
            trust_remote_code=request.trust_remote_code,
            remembered=not asked,
        )

    def _to_proto(self, served: Served) -> pb.ResolvedKernel:
        """The wire form: built once per remembered resolution, then copied with this call's
        leases filled in."""
        template = served.memo.get("proto")
        if not isinstance(template, pb.ResolvedKernel):
            template = convert.resolved_to_proto(
                served.resolution,
                {},
                cached=self.core.serving.cached_variants,
                metadata=self.metadata,
            )
            served.memo["proto"] = template
        out = pb.ResolvedKernel()
        out.CopyFrom(template)
        convert.set_leases(out, served.resolution, served.leases)
        return out

    def fail(
        self, method: str, request: Any, context: grpc.ServicerContext, exc: Exception
    ) -> NoReturn:
        """Every handler's error path (`rpc_handler`): count and log (`_failed`; ReportSuspect's
        desk logs its own line per report, so it is only counted), then abort."""
        kernel = getattr(request, "kernel", None)
        if method in _LOGGED_ELSEWHERE:
            code = classify(exc).detail.code
            self.core.metrics.errors.labels(method, pb.ErrorCode.Name(code)).inc()
        else:
            self._failed(method, exc, kernel, fetching=getattr(request, "allow_fetch", True))
        abort(context, exc, repo_id=clip(kernel.repo_id) if kernel is not None else "")

    def _failed(
        self,
        method: str,
        exc: BaseException,
        kernel: pb.KernelRef | None = None,
        *,
        fetching: bool = True,
    ) -> pb.ErrorDetail:
        """Map, count and log a failed call. FETCH_NOT_ALLOWED for a call that did not ask to
        fetch is the expected first answer of every cold load: logged at debug, not counted
        in `kerneld_rpc_errors_total` (the docs say to alert on it)."""
        kernel = kernel if kernel is not None else pb.KernelRef()
        failure = classify(exc, repo_id=clip(kernel.repo_id))
        expected = not fetching and failure.detail.code == pb.FETCH_NOT_ALLOWED
        if not expected:
            self.core.metrics.errors.labels(method, pb.ErrorCode.Name(failure.detail.code)).inc()
        log.log(
            logging.DEBUG if expected else log_level(failure),
            "%s failed repo=%s selector=%s code=%s: %s",
            method,
            clip(kernel.repo_id) or "-",
            clip(_selector(kernel)),
            pb.ErrorCode.Name(failure.detail.code),
            failure.detail.message,
        )
        return failure.detail

    @rpc_handler
    def Resolve(
        self, request: pb.ResolveRequest, context: grpc.ServicerContext
    ) -> pb.ResolveResponse:
        started = time.monotonic()
        by = self._answer_by(context) if request.allow_fetch else None
        warm = self._remembered(request) if by is not None else None
        # On a miss of `_remembered`, the worker neither checks the request nor looks for a
        # remembered answer again.
        served = warm or self._finish(
            self._start(lambda: self._served(request, asked=by is not None), by),
            by,
            started,
            request.kernel,
        )
        kernel = self._to_proto(served)
        return pb.ResolveResponse(kernel=kernel)

    def _one(
        self, request: pb.ResolveRequest, future: Future[Served], by: float | None, started: float
    ) -> pb.ResolveResult:
        try:
            served = self._finish(future, by, started, request.kernel)
            return pb.ResolveResult(kernel=self._to_proto(served))
        except Exception as exc:
            return pb.ResolveResult(
                error=self._failed("ResolveMany", exc, request.kernel, fetching=request.allow_fetch)
            )

    @rpc_handler
    def ResolveMany(
        self, request: pb.ResolveManyRequest, context: grpc.ServicerContext
    ) -> pb.ResolveManyResponse:
        started = time.monotonic()
        limit = self.core.config.max_resolve_many
        if len(request.requests) > limit:  # each entry costs CPU, a lease and ~1 KB of answer
            raise InvalidInputError(
                f"ResolveMany asked for {len(request.requests)} kernels; at most {limit} per "
                "call ([server] max_resolve_many): split the request"
            )
        requests = list(request.requests)
        fetching = any(r.allow_fetch for r in requests)
        by = self._answer_by(context) if fetching else None
        futures: list[Future[Served]]
        if by is None and len(requests) <= 1:
            futures = [self._start(partial(self._served, r), None) for r in requests]
        else:
            # Misses download in parallel (each kernel is single-flight on its own).
            pool = self._bounded if by is not None else self.core.pool
            futures = [
                pool.submit(contextvars.copy_context().run, self._served, r) for r in requests
            ]
        return pb.ResolveManyResponse(
            results=[self._one(r, f, by, started) for r, f in zip(requests, futures, strict=True)]
        )

    @rpc_handler
    def ListVariants(
        self, request: pb.ListVariantsRequest, context: grpc.ServicerContext
    ) -> pb.ListVariantsResponse:
        started = time.monotonic()
        by = self._answer_by(context) if request.allow_fetch else None
        convert.check_list_variants(request)
        spec = convert.spec_from_ref(request.kernel)
        facts = self.facts.get(request.platform, request.HasField("platform"))
        commit, stale, decisions = self._finish(
            self._start(
                lambda: self.core.serving.list_variants(
                    spec, facts, allow_fetch=request.allow_fetch, caller=identity.current()
                ),
                by,
            ),
            by,
            started,
            request.kernel,
        )
        cached = self.core.serving.cached_variants(spec.repo_id, commit)
        return pb.ListVariantsResponse(
            repo_id=spec.repo_id,
            commit=commit,
            stale=stale,
            variants=convert.decisions_to_proto(decisions, cached),
        )

    @rpc_handler
    def RenewLease(self, request: pb.RenewLeaseRequest, context: grpc.ServicerContext) -> pb.Lease:
        convert.check_lease_id(request.lease_id)
        lease = self.core.serving.renew_lease(request.lease_id, request.lease_seconds)
        return pb.Lease(id=lease.id, expires_at=convert.ts(lease.expires_at))

    @rpc_handler
    def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseLeaseResponse:
        convert.check_lease_id(request.lease_id)
        self.core.serving.release_lease(request.lease_id)
        return pb.ReleaseLeaseResponse()

    @rpc_handler
    def ReportSuspect(
        self, request: pb.ReportSuspectRequest, context: grpc.ServicerContext
    ) -> pb.ReportSuspectResponse:
        """A caller's word that a tree is damaged, checked by the daemon itself (suspect.py);
        the desk writes the one log line per report, so a failure is only counted here."""
        finding = self.suspects.handle(identity.current(), request)
        return suspect.to_proto(finding)

    @rpc_handler
    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.DaemonStatus:
        return daemon_status(self.core)
