"""The RPC path: ask the daemon over its user socket when the published index has no answer.

Rules that keep a training job safe:
- grpc (40-60 ms and ~20 MB to import) is imported only here and only when a call is made;
- before importing it, the socket is probed with a plain AF_UNIX connect (microseconds): a
  missing socket or one nobody listens on means "daemon down" at once, and that is remembered
  for KERNELD_BACKOFF seconds, so later calls in the process do not pay for it again;
- one channel per call, closed before the call returns: nothing of grpc's is open across a
  `fork()` the caller may do next; a child forked after grpc was imported never uses it
  (`_daemon_gate`, which also keeps the back-off and the probe);
- every call carries this process's caller token (`caller`);
- every call has a deadline: KERNELD_TIMEOUT (1 s) for calls that download nothing. A resolve
  that needs a download is asked in two steps: first without fetching, under the short deadline
  (a hung daemon is found within it); only if the daemon answers that the kernel must be
  downloaded is it asked again, allowed to fetch, under KERNELD_FETCH_TIMEOUT.

A Resolve's answer comes back as a plain slotted class (`Resolved`), a listing's as the variant
rules' `Decision`s; errors as the typed errors of `errors`. A Resolve imports neither the
variant rules nor a dataclass: the platform goes out in the form `platform.Platform` already
holds (`PlatformFacts.to_dict()`), and of the daemon's verdicts it keeps the variant ranked
first.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from kerneld_client import _config, _daemon_gate
from kerneld_client._daemon_gate import daemon_down_reason, reset_backoff
from kerneld_client._types import KernelRequest, SuspectReport
from kerneld_client.caller import caller_metadata, forget_token
from kerneld_client.errors import (
    DaemonUnavailable,
    KernelDenied,
    KernelError,
    KernelNotFound,
    KernelUnavailable,
    NoCompatibleVariant,
    RevisionNotFound,
    UntrustedPublisher,
    VariantReason,
    VersionNotFound,
)

if TYPE_CHECKING:
    from kerneld_client.proto import resolve_pb2
    from kerneld_client.variants import Decision, PlatformFacts

__all__ = [
    "ERROR_TRAILER",
    "Resolved",
    "daemon_down_reason",
    "list_variants",
    "report_suspect",
    "reset_backoff",
    "resolve",
]

ERROR_TRAILER = "kerneld-error-bin"
_SERVICE = "/kerneld.v1.Kernels/"

T = TypeVar("T")


class Resolved:
    """A tree the daemon resolved (a `kerneld.v1.ResolvedKernel`), dependencies first.

    `best` is the variant the daemon's rules rank first for this platform (cached or not), or
    None when none fits. A plain slotted class: a frozen dataclass costs about a millisecond
    to define, and this module is imported on every process's first RPC."""

    __slots__ = (
        "archs",
        "backend_type",
        "best",
        "commit",
        "dependencies",
        "digest",
        "fetched",
        "metadata_id",
        "path",
        "ref",
        "repo_id",
        "stale",
        "upstream",
        "variant",
    )

    def __init__(
        self,
        *,
        repo_id: str,
        ref: str,
        commit: str,
        variant: str,
        path: Path,
        digest: str,
        metadata_id: str,
        backend_type: str,
        archs: tuple[str, ...],
        best: str | None,
        stale: bool,
        fetched: bool,
        upstream: str,
        dependencies: tuple[Resolved, ...] = (),
    ) -> None:
        self.repo_id = repo_id
        self.ref = ref
        self.commit = commit
        self.variant = variant
        self.path = path
        self.digest = digest
        self.metadata_id = metadata_id
        self.backend_type = backend_type
        self.archs = archs
        self.best = best
        self.stale = stale
        self.fetched = fetched
        self.upstream = upstream
        self.dependencies = dependencies

    def __repr__(self) -> str:
        return f"Resolved({self.repo_id}@{self.commit} {self.variant} -> {self.path})"


# ------------------------------------------------------------------------------- calls


_FD_DIR = "/proc/self/fd"
#: How long to wait for grpc to drop a closed channel's connection (it takes ~1 ms).
_SETTLE_S = 0.05


def _sockets() -> set[str] | None:
    """This process's open sockets (`socket:[inode]`), or None where /proc is not available."""
    try:
        fds = os.listdir(_FD_DIR)
    except OSError:
        return None
    out = set()
    for fd in fds:
        try:
            target = os.readlink(f"{_FD_DIR}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _settle(before: set[str] | None) -> None:
    """Wait (bounded) until the connection of a closed channel is really gone.

    grpc closes the transport on its own thread shortly after `channel.close()` returns; a
    `fork()` in that window would hand the child a copy of the socket. Waiting for it makes
    "no gRPC connection survives a call" literally true.
    """
    if before is None:
        return
    deadline = time.monotonic() + _SETTLE_S
    while True:
        now = _sockets()
        if now is None or now <= before or time.monotonic() > deadline:
            return
        time.sleep(0.0002)


def _call(
    socket_path: Path,
    method: str,
    request: Any,
    response_type: Any,
    timeout: float,
) -> Any:
    """One unary call on a fresh channel that is closed (connection included) before returning."""
    import grpc

    before = _sockets()
    channel = grpc.insecure_channel(
        f"unix:{socket_path}",
        options=[
            ("grpc.enable_retries", 0),
            ("grpc.max_receive_message_length", 16 << 20),
        ],
    )
    try:
        rpc = channel.unary_unary(
            _SERVICE + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            return rpc(request, timeout=timeout, metadata=caller_metadata(socket_path))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
            forget_token()  # a daemon restarted since: once more with a token of its own
            return rpc(request, timeout=timeout, metadata=caller_metadata(socket_path))
    finally:
        channel.close()
        _settle(before)


def _detail(exc: Any) -> resolve_pb2.ErrorDetail | None:
    from kerneld_client.proto import resolve_pb2

    try:
        trailers = exc.trailing_metadata() or ()
    except Exception:
        return None
    for key, value in trailers:
        if key == ERROR_TRAILER and isinstance(value, bytes):
            try:
                return resolve_pb2.ErrorDetail.FromString(value)
            except Exception:
                return None
    return None


def _socket_gone(socket_path: Path) -> bool:
    try:
        _daemon_gate.probe(socket_path, _config.timeout_s())
    except _daemon_gate.SocketGone:
        return True
    except DaemonUnavailable:
        return False
    return False


class _FetchNeeded(Exception):
    """The daemon would have to download: ask again, allowed to fetch."""


class _Restarting(Exception):
    """The daemon refused a call the way a stopping or starting one does: ask again shortly."""

    def __init__(self, error: DaemonUnavailable, *, down: bool = True) -> None:
        super().__init__(error.message)
        self.error = error
        self.down = down  # whether running out of patience means "daemon down" (the back-off)


def _typed_error(exc: Any, req: KernelRequest, socket_path: Path, *, fetching: bool) -> Exception:
    """Map a grpc.RpcError (status + ErrorDetail trailer) onto a typed error."""
    import grpc

    from kerneld_client._hub_errors import as_kernels_raises
    from kerneld_client.proto import resolve_pb2

    code = exc.code()
    detail = _detail(exc)
    ctx = {
        "repo_id": (detail.repo_id if detail else "") or req.repo_id,
        "revision": (detail.revision if detail else "") or req.ref,
        "hint": detail.hint if detail else "",
    }
    message = (detail.message if detail else "") or str(exc.details() or code)
    if detail is None or detail.code == resolve_pb2.ERROR_CODE_UNSPECIFIED:
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            what = "did not answer in time" if code == grpc.StatusCode.DEADLINE_EXCEEDED else ""
            text = f"kerneld at {socket_path} {what or 'is unavailable'}: {message}"
            if code == grpc.StatusCode.UNAVAILABLE and _socket_gone(socket_path):
                # Its socket went away or nothing listens on it: a restart (a daemon that is
                # up but refuses this connection, at its cap, answers at once instead).
                return _Restarting(DaemonUnavailable(text, **ctx), down=not fetching)
            if not fetching:  # a slow download is no reason to stop asking the daemon
                _daemon_gate.mark_down(text)
            return DaemonUnavailable(text, **ctx)
        if code == grpc.StatusCode.NOT_FOUND:
            return as_kernels_raises(KernelNotFound(message, **ctx))
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return KernelDenied(message, **ctx)
        return KernelUnavailable(f"kerneld answered {code.name}: {message}", **ctx)
    c = detail.code
    if c == resolve_pb2.FETCH_NOT_ALLOWED:
        return _FetchNeeded(message) if not fetching else KernelNotFound(message, **ctx)
    if c == resolve_pb2.REVISION_NOT_FOUND and req.version is not None:
        return VersionNotFound(message, **ctx)
    if c == resolve_pb2.REVISION_NOT_FOUND:
        return as_kernels_raises(RevisionNotFound(message, **ctx))
    if c in (resolve_pb2.KERNEL_NOT_FOUND, resolve_pb2.REVISION_NOT_FOUND):
        return as_kernels_raises(KernelNotFound(message, **ctx))
    if c == resolve_pb2.NO_COMPATIBLE_VARIANT:
        reasons = [VariantReason(v.variant, v.accepted, v.reason) for v in detail.variants]
        return NoCompatibleVariant(
            message, reasons=reasons, repo_id=ctx["repo_id"], revision=ctx["revision"]
        )
    if c == resolve_pb2.KERNEL_DENIED:
        return KernelDenied(message, **ctx)
    if c == resolve_pb2.UNTRUSTED_PUBLISHER:
        return UntrustedPublisher(message, **ctx)
    if c == resolve_pb2.NOT_READY:  # starting (opening its store) or draining
        return _Restarting(
            DaemonUnavailable(f"kerneld at {socket_path} is not ready: {message}", **ctx)
        )
    return KernelUnavailable(message, variant=detail.variant, **ctx)


def _guarded(
    req: KernelRequest,
    socket_path: Path,
    fetching: bool,
    fn: Callable[[], T],
) -> T:
    import grpc

    try:
        return fn()
    except grpc.RpcError as exc:
        raise _typed_error(exc, req, socket_path, fetching=fetching) from None


def _ready(socket_path: Path, req: KernelRequest) -> None:
    if _daemon_gate.forked_after_grpc():
        raise DaemonUnavailable(
            _daemon_gate.FORKED_REASON,
            repo_id=req.repo_id,
            revision=req.ref,
            hint=_daemon_gate.FORKED_HINT,
        )
    reason = daemon_down_reason()
    if reason is not None:
        raise DaemonUnavailable(
            f"{reason} (not retried for a while)", repo_id=req.repo_id, revision=req.ref
        )
    try:
        _daemon_gate.probe(socket_path, _config.timeout_s())
    except _daemon_gate.SocketGone:
        _await_restart(socket_path, req, time.monotonic() + _config.restart_wait_s())
    except DaemonUnavailable as exc:
        _daemon_gate.mark_down(exc.message)
        raise DaemonUnavailable(
            exc.message, repo_id=req.repo_id, revision=req.ref, hint=exc.hint
        ) from None


def _await_restart(socket_path: Path, req: KernelRequest, deadline: float) -> None:
    """Wait (until `deadline`) for a restarting daemon's socket; past it, the daemon is down."""
    try:
        _daemon_gate.await_socket(socket_path, deadline, _config.timeout_s())
    except DaemonUnavailable as exc:
        _daemon_gate.mark_down(exc.message)
        raise DaemonUnavailable(
            exc.message, repo_id=req.repo_id, revision=req.ref, hint=exc.hint
        ) from None


def _through_restart(socket_path: Path, req: KernelRequest, fn: Callable[[], T]) -> T:
    """`fn()`, asked again while the daemon answers like one that is restarting (bounded by
    KERNELD_RESTART_WAIT); past that it counts as down (the back-off)."""
    deadline = time.monotonic() + _config.restart_wait_s()
    while True:
        try:
            return fn()
        except _Restarting as exc:
            if time.monotonic() >= deadline:
                if exc.down:
                    _daemon_gate.mark_down(exc.error.message)
                raise exc.error from None
        time.sleep(0.05)
        _await_restart(socket_path, req, deadline)


def _import_grpc(messages: Literal["resolve_pb2", "kerneld_pb2"] = "resolve_pb2") -> None:
    """Import grpc and `resolve_pb2` (a Resolve's messages) or `kerneld_pb2` (the whole API)
    with the cyclic GC paused. In a process that has imported torch, the collections triggered
    while protobuf builds message classes scan torch's large heap: measured 190 ms of GC in a
    275 ms import, against about 50 ms without it. Nothing here makes cycles worth collecting.
    """
    if "grpc" in sys.modules and f"kerneld_client.proto.{messages}" in sys.modules:
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        import grpc  # noqa: F401

        importlib.import_module(f"kerneld_client.proto.{messages}")
    finally:
        if enabled:
            gc.enable()


def _kernel_ref(req: KernelRequest) -> resolve_pb2.KernelRef:
    from kerneld_client.proto import resolve_pb2

    ref = resolve_pb2.KernelRef(repo_id=req.repo_id)
    if req.locked_commit is not None:
        ref.locked_commit = req.locked_commit
    elif req.version is not None:
        ref.version = req.version
    elif req.revision is not None:
        ref.revision = req.revision
    return ref


def _decisions(messages: Sequence[resolve_pb2.VariantDecision]) -> tuple[Decision, ...]:
    from kerneld_client.wire import decision_from_proto

    return tuple(decision_from_proto(m) for m in messages)


def _resolved(msg: resolve_pb2.ResolvedKernel) -> Resolved:
    meta = msg.metadata
    return Resolved(
        repo_id=msg.repo_id,
        ref=msg.ref,
        commit=msg.commit,
        variant=msg.variant,
        path=Path(msg.path),
        digest=msg.tree_digest,
        metadata_id=meta.id,
        backend_type=meta.backend_type,
        archs=tuple(meta.backend_archs),
        best=next((d.variant for d in msg.variants if d.accepted), None),
        stale=msg.stale,
        fetched=msg.fetched,
        upstream=msg.upstream,
        dependencies=tuple(_resolved(d) for d in msg.dependencies),
    )


def _client_id() -> str:
    return f"pid={os.getpid()} kerneld_client"


def resolve(
    socket_path: Path,
    req: KernelRequest,
    platform: Mapping[str, Any],
    *,
    allow_fetch: bool,
    trust_remote_code: bool = False,
) -> Resolved:
    """Resolve through the daemon (see the module docstring for the two steps); `platform` is
    the process's facts in `PlatformFacts.to_dict()` form (`platform.Platform.raw`)."""
    _ready(socket_path, req)
    _import_grpc()
    from kerneld_client.proto import resolve_pb2
    from kerneld_client.wire import platform_to_proto

    base = resolve_pb2.ResolveRequest(
        kernel=_kernel_ref(req),
        platform=platform_to_proto(platform),
        client=_client_id(),
        trust_remote_code=trust_remote_code,
    )

    def ask(fetch: bool, timeout: float) -> Resolved:
        request = resolve_pb2.ResolveRequest()
        request.CopyFrom(base)
        request.allow_fetch = fetch
        response = _guarded(
            req,
            socket_path,
            fetch,
            lambda: _call(socket_path, "Resolve", request, resolve_pb2.ResolveResponse, timeout),
        )
        return _resolved(response.kernel)

    try:
        try:
            first = _through_restart(socket_path, req, lambda: ask(False, _config.timeout_s()))
        except NoCompatibleVariant as exc:
            if exc.reasons:
                raise
            # "No variants at all" from a no-fetch call means the daemon has never listed this
            # commit (kerneld's resolver says so for an unknown commit): a miss, not a verdict.
            raise _FetchNeeded(exc.message) from None
    except _FetchNeeded:
        if not allow_fetch:
            raise KernelNotFound(
                "no local snapshot in this host's kerneld store, and this call may not download",
                repo_id=req.repo_id,
                revision=req.ref,
            ) from None
        return _through_restart(socket_path, req, lambda: ask(True, _config.fetch_timeout_s()))
    if allow_fetch and first.best is not None and first.best != first.variant:
        # Served from what is cached, but a better variant exists upstream: fetch that one; if
        # that is not possible (fetch policy, upstream down), the cached one still works.
        try:
            return _through_restart(socket_path, req, lambda: ask(True, _config.fetch_timeout_s()))
        except KernelError:
            return first
    return first


def list_variants(
    socket_path: Path, req: KernelRequest, facts: PlatformFacts
) -> tuple[str, tuple[Decision, ...]]:
    """(commit, every variant with its verdict) through the daemon, listing upstream if needed."""
    _ready(socket_path, req)
    _import_grpc("kerneld_pb2")
    from kerneld_client.proto import kerneld_pb2
    from kerneld_client.wire import facts_to_proto

    def ask(fetch: bool, timeout: float) -> tuple[str, tuple[Decision, ...]]:
        request = kerneld_pb2.ListVariantsRequest(
            kernel=_kernel_ref(req), platform=facts_to_proto(facts), allow_fetch=fetch
        )
        response = _guarded(
            req,
            socket_path,
            fetch,
            lambda: _call(
                socket_path, "ListVariants", request, kerneld_pb2.ListVariantsResponse, timeout
            ),
        )
        return response.commit, _decisions(response.variants)

    try:
        return _through_restart(socket_path, req, lambda: ask(False, _config.timeout_s()))
    except _FetchNeeded:
        return _through_restart(socket_path, req, lambda: ask(True, _config.fetch_timeout_s()))


# ------------------------------------------------------------------------------- reports

#: What the daemon accepts of a report (kerneld/server/fronts/rpc/convert.py): longer text is
#: clipped here.
_REPORT_LIMITS = {"repo_id": 193, "commit": 255, "variant": 255, "reason": 512}
_VERDICT_NAMES = {1: "intact", 2: "damaged", 3: "unknown"}


def _report_text(text: str, limit: int) -> str:
    """One line of at most `limit` UTF-8 bytes without control characters (the daemon refuses
    those: they would break its log line)."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line.encode("utf-8")[:limit].decode("utf-8", "ignore")


def report_suspect(
    socket_path: Path,
    digest: str,
    *,
    repo_id: str = "",
    commit: str = "",
    variant: str = "",
    reason: str = "",
    timeout: float | None = None,
) -> SuspectReport:
    """Tell the daemon that tree `digest` ("sha256:<hex>") looks damaged: ReportSuspect.

    Best effort on a path that is already failing: never raises, and waits about `timeout`
    (KERNELD_TIMEOUT) at most, whatever the daemon does; the daemon goes on checking after a
    caller that stopped waiting. A daemon in back-off (found down moments ago) is not asked.
    """
    wait = _config.timeout_s() if timeout is None else timeout
    deadline = time.monotonic() + wait
    if _daemon_gate.forked_after_grpc():
        return SuspectReport("unavailable", _daemon_gate.FORKED_REASON, tree_digest=digest)
    down = daemon_down_reason()
    if down is not None:
        return SuspectReport("unavailable", f"{down} (not retried for a while)", tree_digest=digest)
    try:
        _daemon_gate.probe(socket_path, wait)
        _import_grpc("kerneld_pb2")
        import grpc

        from kerneld_client.proto import kerneld_pb2
    except DaemonUnavailable as exc:
        return SuspectReport("unavailable", exc.message, tree_digest=digest)
    except ImportError as exc:  # grpc or protobuf missing or broken
        return SuspectReport("unavailable", f"cannot talk to kerneld: {exc}", tree_digest=digest)
    fields = {"repo_id": repo_id, "commit": commit, "variant": variant, "reason": reason}
    request = kerneld_pb2.ReportSuspectRequest(
        tree_digest=digest,
        **{k: _report_text(v, _REPORT_LIMITS[k]) for k, v in fields.items()},
    )
    try:
        answer = _call(
            socket_path,
            "ReportSuspect",
            request,
            kerneld_pb2.ReportSuspectResponse,
            max(0.05, deadline - time.monotonic()),
        )
    except grpc.RpcError as exc:
        code = exc.code()
        detail = _detail(exc)
        message = (detail.message if detail else "") or str(exc.details() or code)
        verdict = "rate-limited" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "unavailable"
        return SuspectReport(
            verdict, f"kerneld answered {code.name}: {message}", tree_digest=digest
        )
    except Exception as exc:  # never let a report break the load it comes from
        return SuspectReport("unavailable", f"report failed: {exc!r}", tree_digest=digest)
    return SuspectReport(
        _VERDICT_NAMES.get(int(answer.verdict), "unknown"),
        answer.detail,
        tree_digest=answer.tree_digest or digest,
        refetch_scheduled=answer.refetch_scheduled,
        remembered=answer.remembered,
    )
