"""Typed errors -> gRPC status, HTTP status and `ErrorDetail` (trailer `kerneld-error-bin`).

The one place errors become statuses, so every RPC and every Hub endpoint answer fails the same
way for the same cause, and clients raise typed errors without parsing messages. Each error
class declares its kind (`kerneld/errors.py` says what each means); `STATUSES` below maps a kind
to the gRPC status, the HTTP status, and the `ErrorDetail` code a class gets unless it names a
finer one (`wire_code`: RevisionNotFound's REVISION_NOT_FOUND, FetchNotAllowed's
FETCH_NOT_ALLOWED, NotReady's NOT_READY). NoVariantFits carries every variant's reason; a
RateLimited answer over HTTP carries Retry-After; anything of kind INTERNAL is logged with its
traceback.

The store's file system failing under us is read from the OSError or SQLite error itself: full
(ENOSPC/EDQUOT, SQLite "full") is EXHAUSTED; read-only or EIO is INTERNAL with one log line and no
traceback (a disk fault, not a bug; cached kernels still work).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from kerneld.errors import ErrorKind, WireCode, kind_of, wire_code_of
from kerneld.pipeline.publisher_trust import PublisherUnverified, UntrustedPublisher
from kerneld.pipeline.resolve import FetchNotAllowed, NoVariantFits, ResolveError
from kerneld.server.plumbing.logs import redact
from kerneld.store import DeniedError, LeaseNotFoundError, ResourceExhaustedError, StoreError
from kerneld.upstream.errors import UpstreamError, UpstreamUnavailable
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.wire import decision_to_proto

log = logging.getLogger("kerneld.server")

TRAILER = "kerneld-error-bin"
Code = pb.ErrorCode


class NotReady(Exception):
    """The daemon is still opening its store, or draining on SIGTERM."""

    kind = ErrorKind.UNAVAILABLE
    wire_code: WireCode = "NOT_READY"


class Unimplemented(Exception):
    """An RPC this build cannot serve (e.g. mirror sync without the mirror module)."""

    kind = ErrorKind.UNIMPLEMENTED


class RateLimited(Exception):
    """A caller asked for more downloads than `[fetch] per_uid_rate` allows."""

    kind = ErrorKind.RATE_LIMITED

    def __init__(self, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ReportsRateLimited(RateLimited):
    """A caller sent more ReportSuspect calls than the daemon re-checks per uid (each may
    re-hash a whole tree); its own hint, since no fetch setting is involved."""


class Unauthenticated(Exception):
    """A caller token that is forged, expired or not its sender's (plumbing/identity.py)."""

    kind = ErrorKind.UNAUTHENTICATED


@dataclass(frozen=True)
class Status:
    """How one kind of failure answers: on gRPC, over HTTP, and its default ErrorDetail code."""

    grpc: grpc.StatusCode
    http: int
    code: WireCode


S = grpc.StatusCode
#: The one table from a kind of failure to its answers (the module docstring shows it).
STATUSES: dict[ErrorKind, Status] = {
    ErrorKind.NOT_FOUND: Status(S.NOT_FOUND, 404, "KERNEL_NOT_FOUND"),
    ErrorKind.DENIED: Status(S.PERMISSION_DENIED, 403, "KERNEL_DENIED"),
    ErrorKind.UNAUTHENTICATED: Status(S.UNAUTHENTICATED, 401, "INVALID_ARGUMENT"),
    ErrorKind.INVALID: Status(S.INVALID_ARGUMENT, 400, "INVALID_ARGUMENT"),
    ErrorKind.UNSUITABLE: Status(S.FAILED_PRECONDITION, 404, "NO_COMPATIBLE_VARIANT"),
    ErrorKind.UNAVAILABLE: Status(S.UNAVAILABLE, 503, "UPSTREAM_UNAVAILABLE"),
    ErrorKind.CORRUPT: Status(S.DATA_LOSS, 502, "INTEGRITY_ERROR"),
    ErrorKind.EXHAUSTED: Status(S.RESOURCE_EXHAUSTED, 507, "RESOURCE_EXHAUSTED"),
    ErrorKind.RATE_LIMITED: Status(S.RESOURCE_EXHAUSTED, 429, "RESOURCE_EXHAUSTED"),
    ErrorKind.UNIMPLEMENTED: Status(S.UNIMPLEMENTED, 501, "INTERNAL"),
    ErrorKind.INTERNAL: Status(S.INTERNAL, 500, "INTERNAL"),
}


@dataclass(frozen=True)
class Failure:
    kind: ErrorKind
    status: grpc.StatusCode
    http: int
    detail: pb.ErrorDetail


def _hint(exc: BaseException, repo: str) -> str:
    if isinstance(exc, UntrustedPublisher | PublisherUnverified):
        return exc.hint
    if isinstance(exc, DeniedError):
        return f"ask an admin to run `kerneldctl allow {repo}`" if repo else ""
    if isinstance(exc, FetchNotAllowed):
        return (
            f"ask an admin to prefetch it (`kerneldctl prefetch {repo}`) or to allow fetching "
            "it ([fetch] allow in kerneld.toml)"
            if repo
            else ""
        )
    if isinstance(exc, NoVariantFits):
        return "no build of this kernel fits this platform; fall back to plain PyTorch"
    if isinstance(exc, UpstreamUnavailable):
        return "every upstream is unreachable and the kernel is not cached on this host"
    if isinstance(exc, ResourceExhaustedError):
        return "an admin can raise [store] cap, unpin kernels or run `kerneldctl gc`"
    if isinstance(exc, NotReady):
        return "retry in a moment"
    if isinstance(exc, ReportsRateLimited):
        return (
            "the daemon already re-checks what it was told about (and its scrub re-hashes the "
            "whole store); retry later, or ask an admin to run `kerneldctl verify`"
        )
    if isinstance(exc, RateLimited):
        return (
            "kernels already on this host still load; an admin can prefetch this one "
            "(`kerneldctl prefetch`) or raise [fetch] per_uid_rate"
        )
    if isinstance(exc, Unauthenticated):
        return "connect to the socket's .cred side-channel for a token of your own, or send none"
    if isinstance(exc, LeaseNotFoundError):
        return "resolve the kernel again for a new lease"
    return ""


_FULL = (errno.ENOSPC, errno.EDQUOT)
_BROKEN = (errno.EROFS, errno.EIO)


def store_fault(exc: BaseException) -> str | None:
    """ "full" or "broken" when `exc` is the store's file system failing under us (a disk that
    filled up behind the space reservation, or was remounted read-only after an error)."""
    if isinstance(exc, OSError):
        if exc.errno in _FULL:
            return "full"
        if exc.errno in _BROKEN:
            return "broken"
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        if "full" in text:
            return "full"
        if "disk I/O error" in text or "readonly" in text:
            return "broken"
    return None


_FAULT_HINTS = {
    "full": "the store's file system is full: free space there, lower [store] cap or run "
    "`kerneldctl gc`; kernels already cached keep working",
    "broken": "the store's file system is read-only or failing (a disk error can remount it "
    "read-only): check `dmesg`, repair it and restart kerneld; kernels already cached keep "
    "working meanwhile",
}


def _context(exc: BaseException) -> tuple[str, str, str]:
    """(repo, revision, variant) from whichever error family `exc` belongs to."""
    if isinstance(exc, ResolveError | UpstreamError):
        return exc.repo_id, exc.revision, ""
    if isinstance(exc, StoreError):
        return exc.repo_id or "", exc.commit or "", exc.variant or ""
    return "", "", ""


def _message(exc: BaseException) -> str:
    """The error's own text. Repo and revision travel in their detail fields and every reader
    (client, kerneldctl) puts them in front, so an upstream error's `repo@rev: ` is left out."""
    if isinstance(exc, UpstreamError):
        return f"[{exc.upstream}] {exc.message}" if exc.upstream else exc.message
    if isinstance(exc, ResolveError):
        return exc.message
    return str(exc) or type(exc).__name__


def classify(exc: BaseException, *, repo_id: str = "", revision: str = "") -> Failure:
    """The status and detail for `exc`; `repo_id`/`revision` fill in what the error lacks."""
    kind = kind_of(exc)
    e_repo, e_rev, e_variant = _context(exc)
    repo = e_repo or repo_id
    # Callers of the user socket read this: an upstream's credentials (a URL's userinfo) go.
    message = redact(_message(exc))
    hint = _hint(exc, repo)
    fault = store_fault(exc) if kind is ErrorKind.INTERNAL else None
    if fault is not None:
        if fault == "full":
            kind = ErrorKind.EXHAUSTED
        message = f"store {'full' if fault == 'full' else 'I/O fault'}: {exc}"
        hint = _FAULT_HINTS[fault]
        if not getattr(exc, "_kerneld_logged", False):  # classify runs twice per failed RPC
            log.error("store fault repo=%s revision=%s: %s", repo, revision, message)
            with contextlib.suppress(AttributeError):
                setattr(exc, "_kerneld_logged", True)  # noqa: B010
    elif kind is ErrorKind.INTERNAL:
        log.error("internal error repo=%s revision=%s: %r", repo, revision, exc, exc_info=exc)
        message = f"internal error: {type(exc).__name__}: {exc}"
    status = STATUSES[kind]
    code = wire_code_of(exc) or status.code
    detail = pb.ErrorDetail(
        code=Code.Value(code),
        message=message,
        repo_id=repo,
        revision=e_rev or revision,
        variant=e_variant,
        hint=hint,
    )
    if isinstance(exc, NoVariantFits):
        detail.variants.extend(decision_to_proto(d) for d in exc.decisions)
    return Failure(kind, status.grpc, status.http, detail)


#: Failures that are answers about what was asked (it does not exist, may not be had, was
#: asked wrongly): routine for a job's call, logged at info.
_ANSWERS = frozenset(
    {
        ErrorKind.NOT_FOUND,
        ErrorKind.UNSUITABLE,
        ErrorKind.DENIED,
        ErrorKind.UNAUTHENTICATED,
        ErrorKind.INVALID,
    }
)
#: Faults of the daemon: its own bugs, and what this build cannot do.
_FAULTS = frozenset({ErrorKind.INTERNAL, ErrorKind.UNIMPLEMENTED})


def log_level(failure: Failure, *, admin: bool = False) -> int:
    """The priority of a failed call's log line, so `journalctl -p warning` shows what needs an
    admin: a fault of the daemon is an error; an outage, a corrupt download, a full store or
    a failed admin command (a reload with a bad config) a warning; a job told that its kernel
    does not exist or is refused, info."""
    if failure.kind in _FAULTS:
        return logging.ERROR
    if admin or failure.kind not in _ANSWERS:
        return logging.WARNING
    return logging.INFO


def abort(context: grpc.ServicerContext, exc: BaseException, **ctx: str) -> NoReturn:
    """Fail the RPC with `exc`'s status, message and ErrorDetail trailer."""
    failure = classify(exc, **ctx)
    context.set_trailing_metadata(((TRAILER, failure.detail.SerializeToString()),))
    context.abort(failure.status, failure.detail.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class FailingServicer(Protocol):
    def fail(
        self, method: str, request: Any, context: grpc.ServicerContext, exc: Exception
    ) -> NoReturn:
        """Count and log a failed call of `method`, then `abort` it (never returns)."""
        ...


Handler = TypeVar("Handler", bound=Callable[..., Any])


def _aborted(context: grpc.ServicerContext) -> bool:
    """Did the call already abort (grpc's `abort` raises a bare Exception, which must pass)?"""
    code = getattr(context, "code", None)
    return callable(code) and code() is not None


def rpc_handler(handler: Handler) -> Handler:
    """The one error path of a servicer method: any exception the call raises (for a stream,
    before its first message) goes to the servicer's `fail`, which counts it, logs it and
    aborts with `classify`'s status. A handler raises typed errors and never aborts itself."""
    name = handler.__name__

    if inspect.isgeneratorfunction(handler):

        @functools.wraps(handler)
        def stream(
            self: FailingServicer, request: Any, context: grpc.ServicerContext
        ) -> Iterator[Any]:
            messages = handler(self, request, context)
            try:
                first = next(messages)  # the set-up: what can still fail as a whole call
            except StopIteration:
                return
            except Exception as exc:
                if _aborted(context):
                    raise
                self.fail(name, request, context, exc)
            yield first
            yield from messages

        return stream  # type: ignore[return-value]

    @functools.wraps(handler)
    def unary(self: FailingServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except Exception as exc:
            if _aborted(context):
                raise
            self.fail(name, request, context, exc)

    return unary  # type: ignore[return-value]


def detail_from_trailers(metadata: object) -> pb.ErrorDetail | None:
    """Parse the ErrorDetail out of a call's trailing metadata (tests and tools)."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == TRAILER and isinstance(value, bytes):
            return pb.ErrorDetail.FromString(value)
    return None
