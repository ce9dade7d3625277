"""Who is calling: the kernel's peer credentials of a unix socket, carried into gRPC.

The daemon must know a caller's uid to audit it, to apply `[fetch] allow_groups` and to rate
limit fetches per user; a request's `client` field is whatever the caller wrote. The kernel
knows the peer of every unix socket connection (SO_PEERCRED, SO_PEERGROUPS), but grpcio (1.85)
gives a servicer no way to it: `context.peer()` is just `unix:`, `auth_context()` says only
`insecure` (or `local` with local credentials, still without uid), no API exposes a
connection's descriptor, and a server cannot adopt descriptors accepted elsewhere. Considered
and rejected: one socket per user (unbounded, static), proxying each connection through a
loopback TCP port whose peer address names it (all bytes copied in Python, and TCP bypasses the
socket's mode), matching /proc/*/fd inodes (needs privileges), another RPC stack (grpcio stays).

Chosen: a credentials side-channel. Beside each gRPC socket `S` the daemon listens on a raw
AF_UNIX socket `S.cred` (same mode and group: the same people may use it). It reads the
peer's credentials of each connection, answers one line, a token, and closes: an HMAC-SHA256,
under a random key that lives only in this daemon's memory, over uid, gid, pid, the process's
binding to its process, supplementary groups and an expiry. A client sends the token as gRPC
metadata (`kerneld-caller`); `CallerInterceptor` verifies it and puts the caller in a context
variable for the servicer. A forged token fails the HMAC; one replayed after its process exited
or after it expired is refused with UNAUTHENTICATED. The binding is a pidfd of the peer
(SO_PEERPIDFD) kept by the daemon, or where the kernel has none the process's start time; a
/proc that hides the peer (`ProtectProc=invisible`) on such a kernel gets no token at all. A
call without a token is anonymous: it keeps the socket's rights (old clients still work), but
`allow_groups` cannot admit it and it shares one rate-limit bucket with every anonymous caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import logging
import os
import pwd
import secrets
import select
import socket
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from kerneld.server.plumbing.sockets import MAX_SOCKET_PATH, SocketSetupError
from kerneld.server.statuses import RateLimited, Unauthenticated

log = logging.getLogger("kerneld.identity")
audit_log = logging.getLogger("kerneld.audit")

#: The metadata key the token travels in (also in kerneld_client._rpc).
METADATA_KEY = "kerneld-caller"
#: The side-channel socket beside a gRPC socket `S` is `S` + this suffix.
CRED_SUFFIX = ".cred"
#: How long a token is valid; clients take a new one after half of it.
TOKEN_TTL_S = 600.0
#: Supplementary groups carried in a token (the rest are not seen by `allow_groups`).
MAX_GROUPS = 64
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def cred_path(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.name + CRED_SUFFIX)


@dataclass(frozen=True)
class Caller:
    """A verified caller (uid >= 0) or the anonymous one (uid -1: no valid token sent)."""

    uid: int = -1
    gid: int = -1
    pid: int = 0
    groups: frozenset[int] = field(default_factory=frozenset)

    @property
    def known(self) -> bool:
        return self.uid >= 0

    def __str__(self) -> str:
        if not self.known:
            return "anonymous"
        try:
            name = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            name = "?"
        return f"uid={self.uid}({name}) gid={self.gid} pid={self.pid}"


ANONYMOUS = Caller()
_current: contextvars.ContextVar[Caller] = contextvars.ContextVar(
    "kerneld_caller", default=ANONYMOUS
)


def current() -> Caller:
    """The caller of the RPC this thread serves (ANONYMOUS outside one)."""
    return _current.get()


def audit(caller: Caller, rpc: str, what: str, outcome: str) -> None:
    """One line per admin mutation and per fetch-triggering call, naming the real uid."""
    audit_log.info("audit caller=%s rpc=%s %s result=%s", caller, rpc, what, outcome)


def _start_time(pid: int) -> int:
    """The process's start time (clock ticks since boot): with the pid, names one process;
    -1 when it cannot be read (gone, or hidden: `ProtectProc=invisible`, hidepid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # comm (field 2) may contain spaces and parentheses: count from the last ')'
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


def _exited(pidfd: int) -> bool:
    """Has the process of this pidfd exited? (A pidfd polls readable once it has; unlike a
    pid it is never reused, and it needs no view of the process in /proc.)"""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


# ------------------------------------------------------------------------------- tokens


class TokenBook:
    """Issues and checks tokens under this daemon's random key (never written anywhere).

    A token is bound to the process it was issued to, so that one replayed after that process
    exited is refused: by a pidfd of the process (SO_PEERPIDFD, Linux >= 6.5) the daemon keeps
    while the token lives, or else by the process's start time in /proc. Where neither can be
    had (an older kernel and a /proc that hides other users' processes, as the unit's
    `ProtectProc=invisible` does) no token is issued: the caller is served anonymously."""

    #: Tokens bound by pidfd held at once (a descriptor each); the oldest go first, and their
    #: holders take a new token on the refusal (the client retries once).
    MAX_BOUND = 1024

    def __init__(
        self, *, ttl_s: float = TOKEN_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = secrets.token_bytes(32)
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._bound: OrderedDict[str, tuple[int, float]] = OrderedDict()  # nonce -> (fd, exp)

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(
        self, uid: int, gid: int, pid: int, groups: tuple[int, ...], pidfd: int | None = None
    ) -> str | None:
        """A token for the process `pid` (or `pidfd`: the book takes the descriptor over);
        None when the process cannot be told from a later one with its pid."""
        expires = self.clock() + self.ttl_s
        if pidfd is not None:
            binding = "p" + secrets.token_hex(12)
            self._bind(binding, pidfd, expires)
        else:
            start = _start_time(pid)
            if start < 0:
                return None
            binding = f"s{start}"
        gl = ",".join(str(g) for g in sorted(set(groups))[:MAX_GROUPS])
        payload = f"2.{uid}.{gid}.{pid}.{binding}.{int(expires)}.{gl}"
        return f"{payload}.{self._mac(payload)}"

    def _bind(self, nonce: str, pidfd: int, expires: float) -> None:
        now = self.clock()
        with self._lock:
            if len(self._bound) >= self.MAX_BOUND:  # first drop what is of no use any more
                for key, (fd, exp) in list(self._bound.items()):
                    if exp < now or _exited(fd):
                        del self._bound[key]
                        os.close(fd)
            while len(self._bound) >= self.MAX_BOUND:
                _, (fd, _exp) = self._bound.popitem(last=False)
                os.close(fd)
            self._bound[nonce] = (pidfd, expires)

    def _alive(self, nonce: str) -> bool | None:
        """Is the process the token was bound to running? None: the binding is gone."""
        with self._lock:
            entry = self._bound.get(nonce)
            if entry is None:
                return None
            if not _exited(entry[0]):
                return True
            del self._bound[nonce]
            os.close(entry[0])
            return False

    def verify(self, token: str) -> Caller:
        """The caller a token names; Unauthenticated when it is forged, expired or its process
        has gone."""
        payload, _, mac = token.rpartition(".")
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise Unauthenticated(
                "the caller token was not issued by this kerneld (forged, or from a previous "
                "run of the daemon)"
            )
        _version, uid, gid, pid, binding, expires, gl = payload.split(".")
        if int(expires) < self.clock():
            raise Unauthenticated("the caller token has expired")
        exited = Unauthenticated(
            f"the caller token was issued to process {pid}, which has exited: a token "
            "only works for the process it was issued to"
        )
        if binding.startswith("p"):
            alive = self._alive(binding)
            if alive is None:
                raise Unauthenticated(
                    "the caller token is no longer held by the daemon (too many at once): "
                    "take a new one"
                )
            if not alive:
                raise exited
        elif int(binding[1:]) < 0 or _start_time(int(pid)) != int(binding[1:]):
            raise exited
        groups = frozenset(int(g) for g in gl.split(",") if g)
        return Caller(int(uid), int(gid), int(pid), groups | {int(gid)})

    def close(self) -> None:
        with self._lock:
            for fd, _exp in self._bound.values():
                os.close(fd)
            self._bound.clear()


def peer_pidfd(conn: socket.socket) -> int | None:
    """A pidfd of a connected unix socket's peer process (SO_PEERPIDFD, Linux >= 6.5); None
    where the kernel has none (or the process is gone)."""
    try:
        return int(conn.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD))
    except OSError:
        return None


def peer_credentials(conn: socket.socket) -> tuple[int, int, int, tuple[int, ...]]:
    """(pid, uid, gid, supplementary gids) of a connected unix socket's peer, from the kernel."""
    pid, uid, gid = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    groups: tuple[int, ...] = ()
    for count in (MAX_GROUPS * 4, 65536):
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * count)
        except OSError:  # ERANGE: more groups than fit; or a kernel without SO_PEERGROUPS
            continue
        groups = struct.unpack(f"{len(raw) // 4}I", raw)
        break
    return pid, uid, gid, groups


class CredentialListener:
    """The side-channel socket `S.cred`: one token per connection, from SO_PEERCRED."""

    def __init__(self, path: Path, book: TokenBook) -> None:
        self.path = path
        self.book = book
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def bind(self) -> None:
        """Bind (under the caller's umask; `sockets.secure` sets mode and group after)."""
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise SocketSetupError(
                f"{self.path} (the credentials socket beside the gRPC socket) is longer than "
                f"{MAX_SOCKET_PATH} bytes: choose a shorter socket path"
            )
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                self.path.unlink()  # stale: the gRPC socket's lock says no daemon owns it
        try:
            self._sock.bind(str(self.path))
        except OSError as exc:
            raise SocketSetupError(f"cannot bind {self.path}: {exc.strerror}") from exc
        self._sock.listen(128)
        self._sock.settimeout(0.5)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="cred", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("credentials socket %s: accept failed: %s", self.path, exc)
                time.sleep(0.1)  # EMFILE: do not spin
                continue
            if self._stop.is_set():  # the wake-up connection of stop()
                conn.close()
                return
            with conn:
                try:
                    pid, uid, gid, groups = peer_credentials(conn)
                    token = self.book.issue(uid, gid, pid, groups, peer_pidfd(conn))
                    if token is None:  # closed without one: the client goes anonymous
                        log.info(
                            "credentials socket: no token for pid %d (uid %d): the kernel has "
                            "no SO_PEERPIDFD and its /proc/%d is not readable here",
                            pid,
                            uid,
                            pid,
                        )
                        continue
                    conn.settimeout(0.2)
                    conn.sendall(token.encode() + b"\n")
                except OSError as exc:
                    log.debug("credentials socket: client left early: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        # Wake the blocked accept() now with a connection of our own (shutdown() does not wake
        # it on AF_UNIX): a daemon past its drain timeout must exit at once, not after the
        # accept timeout of each listener.
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as wake:
            wake.settimeout(0.2)
            wake.connect(str(self.path))
        if self._thread is not None:
            self._thread.join(2.0)
        self._sock.close()
        with contextlib.suppress(OSError):
            if self.path.is_socket():
                self.path.unlink()


# ------------------------------------------------------------------------------- gRPC


def _token(details: grpc.HandlerCallDetails) -> str | None:
    for key, value in getattr(details, "invocation_metadata", None) or ():
        if key == METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None


if TYPE_CHECKING:  # generic only in the type stubs
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class CallerInterceptor(_Interceptor):
    """Verifies the token of every call and exposes its caller (`current()`) to the servicer.

    Methods in `audited` (admin mutations) get one audit line with the caller and outcome.
    """

    def __init__(
        self, book: TokenBook, *, audited: Callable[[str], bool] = lambda m: False
    ) -> None:
        self.book = book
        self.audited = audited

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        if handler is None:
            return None
        token = _token(details)
        method = details.method.rsplit("/", 2)
        name = "/".join(method[-2:]).rsplit(".", 1)[-1]
        audited = self.audited(method[-1])
        book = self.book

        def enter(context: grpc.ServicerContext) -> Caller:
            caller = ANONYMOUS
            if token is not None:
                try:
                    caller = book.verify(token)
                except (Unauthenticated, ValueError, IndexError) as exc:
                    from kerneld.server.statuses import abort

                    why = (
                        exc
                        if isinstance(exc, Unauthenticated)
                        else Unauthenticated("the caller token is malformed")
                    )
                    log.warning("refused a caller token on %s: %s", name, why)
                    abort(context, why)
            _current.set(caller)  # every call sets it first: nothing leaks between calls
            return caller

        def summary(request: Any) -> str:
            text = " ".join(str(request).split())
            return f"request={{{text[:300]}}}"

        def outcome(context: grpc.ServicerContext, exc: BaseException | None) -> str:
            if exc is None:
                return "ok"
            code = context.code() if hasattr(context, "code") else None
            return getattr(code, "name", None) or type(exc).__name__

        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                caller = enter(context)
                try:
                    response = inner_uu(request, context)
                except BaseException as exc:
                    if audited:
                        audit(caller, name, summary(request), outcome(context, exc))
                    raise
                finally:
                    _current.set(ANONYMOUS)
                if audited:
                    audit(caller, name, summary(request), "ok")
                return response

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                caller = enter(context)
                if audited:  # streams are audited when they start
                    audit(caller, name, summary(request), "started")
                yield from inner_us(request, context)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # client-streaming methods: kerneld has none; served anonymous


# ------------------------------------------------------------------------------- fetch policy


class FetchGate:
    """`[fetch] allow_groups` and the per-uid token buckets of fetch-triggering calls."""

    #: Asking again for what the same uid asked for this recently is free: the ranks of one
    #: job that start together all miss the same kernels, and join one download (single-flight)
    #: instead of starting new ones, so they must not spend the uid's budget once each.
    REPEAT_FREE_S = 60.0
    MAX_RECENT = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, at)
        self._recent: OrderedDict[tuple[int, str], float] = OrderedDict()  # (uid, what) -> at
        self._exempt = {0, os.geteuid()}

    def may_fetch(self, caller: Caller, allow_gids: frozenset[int] | None) -> bool:
        """Does `[fetch] allow_groups` (resolved to gids; None: everyone) admit `caller`?"""
        if allow_gids is None or caller.uid in self._exempt:
            return True
        return caller.known and bool(caller.groups & allow_gids)

    def take(self, caller: Caller, *, per_minute: float, burst: int, what: str = "") -> None:
        """Spend one fetch of `caller`'s bucket, or raise RateLimited (anonymous callers share
        one bucket); per_minute 0: no limit. `what` (the kernel asked for) already charged to
        this uid within `REPEAT_FREE_S` costs nothing."""
        if per_minute <= 0 or caller.uid in self._exempt:
            return
        now = self.clock()
        rate = per_minute / 60.0
        with self._lock:
            key = (caller.uid, what)
            if what and now - self._recent.get(key, -self.REPEAT_FREE_S) < self.REPEAT_FREE_S:
                return
            tokens, at = self._buckets.get(caller.uid, (float(burst), now))
            tokens = min(float(burst), tokens + (now - at) * rate)
            if tokens < 1.0:
                self._buckets[caller.uid] = (tokens, now)
                wait = (1.0 - tokens) / rate
                who = f"uid {caller.uid}" if caller.known else "anonymous callers (no token)"
                raise RateLimited(
                    f"too many downloads asked for by {who}: at most {burst} at once and "
                    f"{per_minute:g} per minute ([fetch] per_uid_burst, per_uid_rate); "
                    f"retry in {wait:.1f}s",
                    retry_after_s=wait,
                )
            self._buckets[caller.uid] = (tokens - 1.0, now)
            if what:
                self._recent[key] = now
                self._recent.move_to_end(key)
                while len(self._recent) > self.MAX_RECENT:
                    self._recent.popitem(last=False)
            if len(self._buckets) > 65536:  # bounded whatever happens (uids are few anyway)
                self._buckets.pop(next(iter(self._buckets)))
