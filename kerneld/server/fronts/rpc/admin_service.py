"""The `Admin` service on the admin socket: everything that mutates the store or its policy.

Only members of the admin socket's group can connect (the socket mode is the access control).
Every mutation is logged as one `admin:` line with what changed.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import grpc

from kerneld.errors import ErrorKind
from kerneld.pipeline.fetch_progress import FetchProgress
from kerneld.pipeline.prefetch import parse_torch_versions
from kerneld.pipeline.resolve import KernelSpec
from kerneld.server.fronts.rpc import convert
from kerneld.server.fronts.rpc.hosts import AdminHost
from kerneld.server.fronts.rpc.kernels_service import daemon_status
from kerneld.server.statuses import Unimplemented, abort, classify, log_level, rpc_handler
from kerneld.store import ALL
from kerneld.store.deny_rules import (
    REF,
    DenyTarget,
    deny_kind,
    meaning,
    plan_allow,
    plan_deny,
    ref_commits,
)
from kerneld.store.inventory import VariantItem, inventory
from kerneld.store.verify import Quarantined
from kerneld.upstream.errors import UpstreamError
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto import kerneld_pb2_grpc as pb_grpc
from kerneld_client.vocabulary import is_commit_prefix
from kerneld_client.wire import facts_from_proto

log = logging.getLogger("kerneld.admin")

_PREFETCH_KINDS = {
    "kernel-started": pb.PrefetchEvent.KERNEL_STARTED,
    "file-progress": pb.PrefetchEvent.FILE_PROGRESS,
    "file-done": pb.PrefetchEvent.FILE_DONE,
    "variant-done": pb.PrefetchEvent.VARIANT_DONE,
    "kernel-done": pb.PrefetchEvent.KERNEL_DONE,
    "kernel-failed": pb.PrefetchEvent.KERNEL_FAILED,
    "finished": pb.PrefetchEvent.FINISHED,
}
_VERIFY_KINDS = {
    "corrupt": pb.VerifyEvent.CORRUPT,
    "missing": pb.VerifyEvent.MISSING,
    "unknown": pb.VerifyEvent.UNKNOWN_FILE,
    "untrusted": pb.VerifyEvent.UNTRUSTED,
    "io": pb.VerifyEvent.IO_ERROR,
}
_DONE = object()


def quarantine_entry(q: Quarantined) -> pb.QuarantineEntry:
    """One quarantine entry on the wire (`kerneldctl verify` lists them)."""
    entry = pb.QuarantineEntry(
        name=q.name,
        object=q.object,
        id=q.id,
        bytes=q.size_bytes,
        reason=q.reason,
        by=q.by,
        moved=q.moved,
        quarantined_at=convert.ts(q.quarantined_at),
    )
    entry.variants.extend(pb.VariantRef(repo_id=r, commit=c, variant=v) for r, c, v in q.variants)
    return entry


def prefetch_event(update: FetchProgress) -> pb.PrefetchEvent:
    event = pb.PrefetchEvent(
        kind=_PREFETCH_KINDS[update.kind],
        repo_id=update.repo_id,
        commit=update.commit,
        variant=update.variant,
        path=update.path,
        bytes_done=update.bytes_done,
        bytes_total=update.bytes_total,
        files_done=update.files_done,
        files_total=update.files_total,
        tree_digest=update.tree_digest,
        kernels_ok=update.kernels_ok,
        kernels_failed=update.kernels_failed,
        already_present=update.already_present,
    )
    if update.cause is not None:
        event.error.CopyFrom(classify(update.cause, repo_id=update.repo_id).detail)
    return event


class _StreamClosed(Exception):
    """The RPC ended (the caller went away): stops a bounded stream's producer."""

    kind = ErrorKind.INTERNAL


def _variant_entry(v: VariantItem, with_depends: bool = False) -> pb.VariantEntry:
    entry = pb.VariantEntry(
        variant=v.variant,
        tree_digest=v.tree_digest,
        path=v.path,
        size_bytes=v.size_bytes,
        files=v.files,
        last_resolved=convert.ts(v.last_resolved),
        pinned=v.pinned,
        active_leases=v.active_leases,
    )
    if with_depends:  # the daemon reads the store; an admin may not be able to
        meta = convert.metadata_to_proto(Path(v.path) / "metadata.json")
        entry.kernel_depends.extend(meta.kernel_depends)
    record = v.provenance
    if record is not None:
        entry.provenance.CopyFrom(
            pb.Provenance(
                status=record.status,
                signer=record.signer,
                issuer=record.issuer,
                detail=record.detail,
                checked_at=convert.ts(record.checked_at),
            )
        )
    return entry


def _stream(
    context: grpc.ServicerContext,
    work: Callable[[Callable[[object], None]], None],
    *,
    max_pending: int = 0,
) -> Iterator[object]:
    """Run `work(emit)` in a thread and yield what it emits as it emits it; an exception it
    raises ends the stream with that error. The RPC's cancellation reaches `work` through the
    callbacks it registers on `context`. `max_pending` > 0 bounds the items waiting to be sent
    (a mirror export streams file data: a slow caller must slow the export, not fill memory);
    emit then blocks, and raises once the RPC has ended so the producer stops."""
    items: queue.Queue[object] = queue.Queue(maxsize=max_pending)
    ended = threading.Event()

    def put(item: object) -> None:
        while True:
            try:
                items.put(item, timeout=0.5)
                return
            except queue.Full:
                if ended.is_set():
                    raise _StreamClosed from None

    def run() -> None:
        try:
            work(put)
        except _StreamClosed:
            return
        except BaseException as exc:
            with contextlib.suppress(_StreamClosed):
                put(exc)
        finally:
            with contextlib.suppress(_StreamClosed):
                put(_DONE)

    context.add_callback(ended.set)
    threading.Thread(target=run, name="admin-stream", daemon=True).start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                abort(context, item)
            yield item
    finally:
        ended.set()


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, core: AdminHost, *, reload: Callable[[], tuple[bool, str]]) -> None:
        self.core = core
        self.reload = reload
        self._gc_lock = threading.Lock()

    def fail(
        self, method: str, request: object, context: grpc.ServicerContext, exc: Exception
    ) -> NoReturn:
        """Every handler's error path (`rpc_handler`): count, one log line, abort."""
        failure = classify(exc)
        self.core.metrics.errors.labels(method, pb.ErrorCode.Name(failure.detail.code)).inc()
        level = log_level(failure, admin=True)
        log.log(level, "admin: %s failed: %s", method, failure.detail.message)
        abort(context, exc)

    # ---- prefetch -------------------------------------------------------------------------

    @rpc_handler
    def Prefetch(
        self, request: pb.PrefetchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.PrefetchEvent]:
        specs = [convert.spec_from_ref(k) for k in request.kernels]
        specs = specs or self.core.configured_specs()
        if not specs:
            raise ValueError("no kernels given, and none configured in [prefetch] kernels")
        torch = sorted(parse_torch_versions(request.torch_versions))
        platforms = [facts_from_proto(p) for p in request.platforms]
        self.core.prefetcher  # noqa: B018 - raises NotReady while starting
        variants = list(request.variants)
        log.info(
            "admin: prefetch kernels=%s variants=%s torch=%s platforms=%d",
            ",".join(str(s) for s in specs),
            ",".join(variants) or "auto",
            ",".join(f"{a}.{b}" for a, b in torch) or "configured",
            len(platforms),
        )
        cancel = threading.Event()
        context.add_callback(cancel.set)

        def work(emit: Callable[[object], None]) -> None:
            summary = self.core.prefetch(
                specs,
                variants=variants,
                torch_versions=torch,
                platforms=platforms,
                emit=lambda update: emit(prefetch_event(update)),
                cancel=cancel,
            )
            log.info(
                "admin: prefetch finished ok=%d failed=%d fetched=%d present=%d bytes=%d",
                summary.kernels_ok,
                summary.kernels_failed,
                summary.variants_fetched,
                summary.variants_present,
                summary.bytes,
            )

        for event in _stream(context, work):
            assert isinstance(event, pb.PrefetchEvent)
            yield event

    # ---- listing --------------------------------------------------------------------------

    @rpc_handler
    def List(self, request: pb.ListRequest, context: grpc.ServicerContext) -> pb.ListResponse:
        return self._list(list(request.repo_ids), with_depends=request.with_depends)

    def _list(self, only: list[str], *, with_depends: bool = False) -> pb.ListResponse:
        self.core.leases.flush()
        out = pb.ListResponse()
        for kernel in inventory(self.core.store, only or None):
            entry = pb.KernelEntry(
                repo_id=kernel.repo_id, pinned=kernel.pinned, denied=kernel.denied
            )
            for rev in kernel.revisions:
                entry.revisions.append(
                    pb.RevisionEntry(
                        commit=rev.commit,
                        refs=rev.refs,
                        variants=[_variant_entry(v, with_depends) for v in rev.variants],
                        pinned=rev.pinned,
                        denied=rev.denied,
                        denied_by=rev.denied_by,
                        denied_refs=rev.denied_refs,
                    )
                )
            out.kernels.append(entry)
        return out

    # ---- pins -----------------------------------------------------------------------------

    def _pin_commit(self, spec: KernelSpec, *, network: bool) -> str:
        if network:
            try:
                return self.core.resolver.commit_for(spec)[0]
            except UpstreamError:
                pass
        commit = self.core.names.resolve_revision(spec.repo_id, spec.ref)
        if commit is None:
            raise ValueError(
                f"{spec} is not known on this host and no upstream could resolve it; "
                "prefetch it first or give a commit"
            )
        return commit

    def _tree_count(self, repo: str, commit: str, variant: str) -> int:
        rows = self.core.catalog.variants_of(repo, commit)
        return len({r.tree for r in rows if variant in (ALL, r.variant)})

    @rpc_handler
    def Pin(self, request: pb.PinRequest, context: grpc.ServicerContext) -> pb.PinResponse:
        spec = convert.spec_from_ref(request.kernel)
        commit = self._pin_commit(spec, network=True)
        variant = request.variant or ALL
        self.core.names.pin(spec.repo_id, commit, variant)
        trees = self._tree_count(spec.repo_id, commit, variant)
        log.info(
            "admin: pin repo=%s ref=%s commit=%s variant=%s trees=%d reason=%s",
            spec.repo_id,
            spec.ref,
            commit,
            variant,
            trees,
            request.reason or "-",
        )
        return pb.PinResponse(commit=commit, trees=trees)

    @rpc_handler
    def Unpin(self, request: pb.PinRequest, context: grpc.ServicerContext) -> pb.PinResponse:
        spec = convert.spec_from_ref(request.kernel)
        commit = self._pin_commit(spec, network=False)
        variant = request.variant or ALL
        removed = False
        for revision in dict.fromkeys((commit, spec.ref)):
            removed = self.core.names.unpin(spec.repo_id, revision, variant) or removed
        trees = self._tree_count(spec.repo_id, commit, variant) if removed else 0
        log.info(
            "admin: unpin repo=%s ref=%s commit=%s variant=%s removed=%s",
            spec.repo_id,
            spec.ref,
            commit,
            variant,
            removed,
        )
        return pb.PinResponse(commit=commit, trees=trees)

    # ---- denies ---------------------------------------------------------------------------

    def _deny_target(self, request: pb.DenyRequest, *, allow: bool) -> DenyTarget:
        """The row a Deny writes or an Allow lifts: a ref or commit prefix resolved to its
        commit by the resolver (a prefix is not recorded as a ref), else from the store."""
        if not request.repo_id:
            raise ValueError("repo_id is required")

        def ask(revision: str) -> str | None:
            spec = KernelSpec(request.repo_id, revision=revision)
            try:
                return self.core.resolver.commit_for(spec, record=not is_commit_prefix(revision))[0]
            except UpstreamError:
                return None

        plan = plan_allow if allow else plan_deny
        return plan(
            self.core.store, request.repo_id, request.revision, ref=request.ref, ask_upstream=ask
        )

    @rpc_handler
    def Deny(self, request: pb.DenyRequest, context: grpc.ServicerContext) -> pb.DenyResponse:
        target, names = self._deny_target(request, allow=False), self.core.names
        before = {(d.revision, d.reason) for d in names.denies(target.repo)}
        names.deny(target.repo, target.revision, request.reason)
        changed = (target.revision, request.reason) not in before
        log.info(
            "admin: deny %s changed=%s reason=%s", _fields(target), changed, request.reason or "-"
        )
        return _deny_response(target, changed)

    @rpc_handler
    def Allow(self, request: pb.DenyRequest, context: grpc.ServicerContext) -> pb.DenyResponse:
        target = self._deny_target(request, allow=True)
        changed = self.core.names.allow(target.repo, target.revision)
        log.info("admin: allow %s changed=%s", _fields(target), changed)
        return _deny_response(target, changed)

    @rpc_handler
    def ListDenies(
        self, request: pb.ListDeniesRequest, context: grpc.ServicerContext
    ) -> pb.ListDeniesResponse:
        store, entries = self.core.store, []
        for d in self.core.names.denies():
            kind = deny_kind(d.revision)
            commits = ref_commits(store, d.repo, d.revision) if kind == REF else []
            entries.append(
                pb.DenyEntry(
                    repo_id=d.repo,
                    revision=d.revision,
                    reason=d.reason,
                    created_at=convert.ts(d.created_at),
                    kind=kind,
                    meaning=meaning(d.revision, commits),
                    commits=commits,
                )
            )
        return pb.ListDeniesResponse(denies=entries)

    # ---- GC and verification --------------------------------------------------------------

    @rpc_handler
    def GarbageCollect(self, request: pb.GcRequest, context: grpc.ServicerContext) -> pb.GcResponse:
        gc = self.core.collection
        self.core.leases.flush()
        with self._gc_lock:
            policy = gc.policy
            if request.target_free_bytes:
                free = self.core.space.usage().free_bytes
                gc.policy = replace(policy, free_target_bytes=free + request.target_free_bytes)
            try:
                report = gc.collect(dry_run=request.dry_run)
            finally:
                gc.policy = policy
        out = pb.GcResponse(
            freed_bytes=report.bytes_freed,
            orphan_blobs_removed=len(report.blobs_deleted),
            dry_run=request.dry_run,
        )
        for decision in report.trees:
            repo, commit, variant = decision.variants[0] if decision.variants else ("", "", "")
            item = pb.GcItem(
                tree_digest=f"sha256:{decision.digest}",
                repo_id=repo,
                commit=commit,
                variant=variant,
                # removed: what deleting it freed; kept: its size (what keeping it holds)
                size_bytes=(
                    decision.bytes_freed if decision.action == "delete" else decision.size_bytes
                ),
                reason=decision.reason,
            )
            (out.removed if decision.action == "delete" else out.kept).append(item)
        self.core.metrics.gc_runs.labels(str(request.dry_run).lower()).inc()
        if not request.dry_run:
            self.core.metrics.gc_freed.inc(report.bytes_freed)
        log.info(
            "admin: gc dry_run=%s removed=%d kept=%d freed=%d orphan_blobs=%d target_free=%d",
            request.dry_run,
            len(out.removed),
            len(out.kept),
            report.bytes_freed,
            len(report.blobs_deleted),
            request.target_free_bytes,
        )
        return out

    @rpc_handler
    def Verify(
        self, request: pb.VerifyRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.VerifyEvent]:
        wanted = {d.removeprefix("sha256:") for d in request.tree_digests}
        if wanted and request.repair:
            raise ValueError("repair applies to the whole store; give no tree_digests")
        report = self.core.repair.verify(repair=request.repair)
        shown = 0
        for problem in report.problems:
            if wanted and not any(w in problem.id or w in problem.path for w in wanted):
                continue
            shown += 1
            self.core.metrics.verify_failures.labels(problem.kind).inc()
            yield pb.VerifyEvent(
                problem=_VERIFY_KINDS.get(problem.kind, pb.VerifyEvent.PROBLEM_UNSPECIFIED),
                path=problem.path,
                detail=f"{problem.object} {problem.id}: {problem.detail}",
            )
        for repaired in report.repaired:
            yield pb.VerifyEvent(problem=pb.VerifyEvent.REPAIRED, detail=repaired)
        for q in self.core.quarantine.entries() if request.quarantine else []:
            if wanted and q.id not in wanted:
                continue
            yield pb.VerifyEvent(
                problem=pb.VerifyEvent.QUARANTINED,
                path=str(q.path),
                detail=q.describe(),
                entry=quarantine_entry(q),
            )
        log.info(
            "admin: verify repair=%s blobs=%d trees=%d problems=%d exit_mask=%d repaired=%d",
            request.repair,
            report.blobs_checked,
            report.trees_checked,
            len(report.problems),
            report.exit_code,
            len(report.repaired),
        )
        scope = f"{len(wanted)} tree(s) of a whole-store check" if wanted else "whole store"
        yield pb.VerifyEvent(
            problem=pb.VerifyEvent.SUMMARY,
            exit_mask=report.exit_code,
            blobs_checked=report.blobs_checked,
            trees_checked=report.trees_checked,
            detail=f"{shown} problem(s) in {scope}; {len(report.repaired)} repaired",
        )

    # ---- mirrors --------------------------------------------------------------------------

    @rpc_handler
    def MirrorExport(
        self, request: pb.MirrorExportRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.MirrorEvent]:
        from kerneld.server.fronts.rpc import mirror_rpc

        work = mirror_rpc.export_work(self.core, request)
        for event in _stream(context, work, max_pending=mirror_rpc.MAX_PENDING_EVENTS):
            assert isinstance(event, pb.MirrorEvent)
            yield event

    @rpc_handler
    def MirrorImport(
        self, request: pb.MirrorImportRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.MirrorEvent]:
        from kerneld.server.fronts.rpc import mirror_rpc

        work = mirror_rpc.import_work(self.core, request)
        for event in _stream(context, work):
            assert isinstance(event, pb.MirrorEvent)
            yield event

    @rpc_handler
    def MirrorImportUpload(
        self, request: Iterator[pb.MirrorUpload], context: grpc.ServicerContext
    ) -> Iterator[pb.MirrorEvent]:
        from kerneld.server.fronts.rpc import mirror_rpc

        work = mirror_rpc.upload_work(self.core, request)
        for event in _stream(context, work):
            assert isinstance(event, pb.MirrorEvent)
            yield event

    # ---- config and status ----------------------------------------------------------------

    @rpc_handler
    def ReloadConfig(
        self, request: pb.ReloadConfigRequest, context: grpc.ServicerContext
    ) -> pb.ReloadConfigResponse:
        changed, detail = self.reload()
        return pb.ReloadConfigResponse(changed=changed, detail=detail)

    @rpc_handler
    def GetAdminStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.AdminStatus:
        status = daemon_status(self.core)
        names, quarantine = self.core.names, self.core.quarantine
        self.core.leases.flush()
        cfg = self.core.config
        now = time.time()
        entries, held = quarantine.usage()
        out = pb.AdminStatus(
            status=status,
            active_leases=self.core.active_leases(),
            pins=len(names.pins()),
            denies=len(names.denies()),
            quarantine_entries=entries,
            quarantine_bytes=held,
            quarantine_max_bytes=quarantine.max_bytes,
        )
        for repo in names.repos():
            for ref in names.refs_of(repo):
                out.refs.append(
                    pb.RefState(
                        repo_id=repo,
                        ref=ref.ref,
                        commit=ref.commit,
                        fetched_at=convert.ts(ref.fetched_at),
                        stale=now - ref.fetched_at >= cfg.ref_ttl_s
                        and self.core.resolver.failing(repo, ref.ref),
                    )
                )
        for rec in list(self.core.fetches)[::-1]:
            out.recent_fetches.append(
                pb.FetchRecord(
                    repo_id=rec.repo,
                    commit=rec.commit,
                    variant=rec.variant,
                    upstream=rec.upstream,
                    bytes=rec.bytes,
                    seconds=rec.seconds,
                    at=convert.ts(rec.at),
                    error=rec.error,
                )
            )
        return out


__all__ = ["AdminService", "Unimplemented", "prefetch_event"]


def _deny_response(target: DenyTarget, changed: bool) -> pb.DenyResponse:
    return pb.DenyResponse(
        changed=changed, revision=target.revision, kind=target.kind, resolved_from=target.asked
    )


def _fields(target: DenyTarget) -> str:
    """A deny row as an `admin:` line names it."""
    return (
        f"repo={target.repo} revision={target.revision} kind={target.kind} "
        f"resolved_from={target.asked or '-'}"
    )
