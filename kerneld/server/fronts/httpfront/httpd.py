"""The HTTP front of the daemon's HTTP listeners (the metrics exposition and the Hub API
endpoint): one poller and a pool of workers over the sockets `httplisteners.py` binds.

Every local user can reach a loopback port, so nothing of a connection is read before the
daemon knows whose it is: the peer is identified at `accept()` (`identify`: SO_PEERCRED on a
unix socket, the kernel's socket diagnostics on TCP; a peer already gone is refused) and
checked (`admit`); a refused one gets a short fixed answer and is closed without a byte of its
request parsed. An admitted connection then costs a file descriptor, not a thread: one poller
thread reads request heads (at most `head_bytes`, within `head_deadline_s`, bare CR refused)
and waits out idle keep-alive connections; only a complete head goes to one of `workers`
threads, which runs the handler for that one request
(`kerneld.server.fronts.httpfront.httpexchange`), once the poller has also read its body whole (at
most `body_bytes`, within `body_deadline_s`: a head announcing a body never sent holds no worker).
Connections and workers are shared fairly among uids (`kerneld.server.fronts.httpfront.httpshare`:
no two uids can take them all; a uid holding nothing always gets in), and refusals are answered at
most `refusals_per_s` a second per uid. (Why not a server library: bench/RESULTS.md, "HTTP front".)
The bytes of a head are checked here (`check_head`: size, header count, CRLF only, no NUL or line
folding) before h11, a maintained sans-IO HTTP/1.1 parser, parses it and the body: one h11
connection per socket, fed exactly one request at a time, so every pipelined head is checked too.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import h11

from kerneld.server.fronts.httpfront.httpexchange import Exchange, HttpHandler
from kerneld.server.fronts.httpfront.httphead import (
    HeadError,
    HttpLimits,
    check_head,
    fixed_answer,
    read_body,
    read_head,
)
from kerneld.server.fronts.httpfront.httpshare import FairShare, RefusalBudget
from kerneld.server.plumbing.identity import Caller

log = logging.getLogger("kerneld.httpd")

#: listen(2) backlog (the kernel caps it at net.core.somaxconn): the 64 ranks of a job connect
#: at once, and an outsider's connect flood fills a short backlog; each dropped SYN costs its
#: client a 1 s (then 3 s...) retry.
BACKLOG = 4096


#: Identifies the peer of an accepted socket (None: unknown or gone: refused).
Identify = Callable[[socket.socket, Any], "Caller | None"]
#: May this caller use the listener? (allowed, why not).
Admit = Callable[[Caller], tuple[bool, str]]


class _Conn:
    """One accepted connection, owned by the poller while it waits for a head."""

    __slots__ = (
        "buf",
        "caller",
        "deadline",
        "draining",
        "in_head",
        "last",
        "listener",
        "need",
        "parser",
        "peer",
        "request",
        "sock",
    )

    def __init__(self, sock: socket.socket, peer: Any, caller: Caller, listener: str) -> None:
        self.sock = sock
        self.peer = peer
        self.caller = caller
        self.buf = b""  # bytes read and not yet given to the parser
        self.deadline = 0.0
        self.in_head = True  # the first request's head is due within the head deadline
        self.draining = False
        self.last = False  # kept open while the front quiesces, for one more request
        self.listener = listener
        self.parser = h11.Connection(h11.SERVER)
        self.request: h11.Request | None = None  # parsed; its body is being read
        self.need = 0  # while a body is read: its announced length


class _Listener:
    """A bound, listening socket and how its peers are named; `refusal`: every connection gets
    this answer (a socket systemd passed that must not be served, but stays held: see
    `kerneld.server.plumbing.exposure`)."""

    def __init__(self, sock: socket.socket, where: str, tcp: bool, refusal: str = "") -> None:
        self.sock = sock
        self.where = where
        self.tcp = tcp
        self.refusal = refusal


class HttpFront:
    """The poller and the workers of one named group of listeners (see the module doc)."""

    def __init__(
        self,
        name: str,
        handler: HttpHandler,
        *,
        identify: Identify,
        admit: Admit | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.name = name
        self.handler = handler
        self.identify = identify
        self.admit = admit
        self.limits = limits or HttpLimits()
        self.listeners: list[_Listener] = []
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._returned: queue.SimpleQueue[tuple[_Conn, bool]] = queue.SimpleQueue()
        self._conns: set[_Conn] = set()
        lim = self.limits
        self._slots = FairShare(
            lim.max_connections,
            per_uid=lim.per_uid_connections,
            reserve=lim.reserve_connections,
            newcomer=lim.newcomer_connections,
        )
        self._workers = FairShare(
            lim.workers,
            per_uid=lim.per_uid_workers,
            reserve=lim.reserve_workers,
            newcomer=lim.newcomer_workers,
        )
        self._refusals = RefusalBudget(lim.refusals_per_s)
        self._draining = 0
        self._parked: dict[int, deque[tuple[_Conn, h11.Request, bytes]]] = {}  # for a worker
        self._refused_log: dict[tuple[int, str], tuple[float, int]] = {}
        self._stop = threading.Event()
        self._quiescing = threading.Event()
        self._quiesced = threading.Event()  # the poller has closed its listeners
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-http")
        self.server_version = "kerneld"

    # -- lifecycle ----------------------------------------------------------------------------

    def add(
        self,
        sock: socket.socket,
        where: str,
        *,
        tcp: bool,
        listening: bool = False,
        refusal: str = "",
    ) -> None:
        """Serve `sock`; `listening`: already listening (passed by systemd, whose Backlog= it
        keeps), else bound here and put into listen mode; `refusal`: answer every connection
        with a 503 saying this instead (nothing of it read)."""
        if not listening:
            sock.listen(BACKLOG)
        sock.setblocking(False)
        self.listeners.append(_Listener(sock, where, tcp, refusal))

    def start(self) -> None:
        for listener in self.listeners:
            self._selector.register(listener.sock, selectors.EVENT_READ, listener)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def quiesce(self) -> None:
        """Accept no more connections and close the idle ones; requests already accepted are
        still answered (`stop` waits for them). Connections not yet accepted stay in the
        backlog: with socket activation systemd keeps the socket and the next daemon takes
        them; a connection cut here instead would fail the client's request."""
        self._quiescing.set()
        self._wake()

    def busy(self) -> int:
        """Connections with a request being read or answered, or kept open while quiescing
        for the one request their client may be sending (`_Conn.last`)."""
        for _ in range(5):  # read from another thread than the poller's
            try:
                return sum(
                    1
                    for c in list(self._conns)
                    if not c.draining and (c.in_head or c.buf or c.last)
                )
            except RuntimeError:  # the set changed while it was copied
                time.sleep(0.001)
        return 1

    def stop(self, grace: float = 0.0) -> None:
        """Stop; requests accepted before get up to `grace` seconds to be answered."""
        self.quiesce()
        deadline = time.monotonic() + grace
        # Until the poller has closed its listeners it may still accept: a connection accepted
        # after `busy()` was last asked would be closed unanswered (a reset for the client).
        if self._thread is not None:
            self._quiesced.wait(max(0.0, grace) + 1.0)
        while self._thread is not None and self.busy() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.close()

    def close(self) -> None:
        for listener in self.listeners:
            listener.sock.close()
        for conn in list(self._conns):
            self._forget(conn)
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the poller ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            deadlines = [c.deadline for c in self._conns if c.deadline > 0]
            timeout = max(0.0, min([now + 1.0, *deadlines]) - now)
            try:
                events = self._selector.select(timeout)
            except OSError as exc:  # EBADF at stop
                if self._stop.is_set():
                    return
                log.warning("%s: select failed: %s", self.name, exc)
                time.sleep(0.1)
                continue
            for key, _ in events:
                data = key.data
                try:
                    if data is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    elif isinstance(data, _Listener):
                        if not self._quiescing.is_set():  # the backlog is the next daemon's
                            self._accept(data)
                    else:
                        self._readable(data)
                except Exception:  # one connection's surprise must not stop the listener
                    log.exception("%s: a connection failed in the poller", self.name)
                    if isinstance(data, _Conn):
                        self._forget(data)
            try:
                self._take_returned()
                self._expire(time.monotonic())
                if self._quiescing.is_set():
                    self._close_listeners_and_idle()
                    self._quiesced.set()
            except Exception:
                log.exception("%s: the poller's bookkeeping failed", self.name)

    def _close_listeners_and_idle(self) -> None:
        for listener in self.listeners:
            if listener.sock.fileno() >= 0:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(listener.sock)
                listener.sock.close()
        for conn in [c for c in self._conns if not c.draining and not c.in_head and not c.buf]:
            # registered (not with a worker), idle, and no request already in its buffer (sent
            # before the stop, not yet read: the next select reads it, and it is answered)
            if conn.deadline > 0 and not conn.last and not _unread(conn.sock):
                self._forget(conn)

    def _accept(self, listener: _Listener) -> None:
        for _ in range(64):  # then let the others have a turn
            if self._quiescing.is_set():
                return
            try:
                sock, peer = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("%s %s: accept failed: %s", self.name, listener.where, exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # do not spin while descriptors are short
                return
            self._admit(sock, peer, listener)

    def _admit(self, sock: socket.socket, peer: Any, listener: _Listener) -> None:
        """Identify and check the peer before reading a byte of it."""
        if listener.refusal:
            self._refuse(sock, -1, 503, "Service Unavailable", f"kerneld: {listener.refusal}")
            return
        try:
            caller = self.identify(sock, peer)
        except Exception as exc:  # an identification that fails refuses, never admits
            log.warning("%s: identifying a peer failed: %s", self.name, exc)
            caller = None
        if caller is None or not caller.known:
            self._refuse(
                sock,
                -1,
                403,
                "Forbidden",
                "kerneld: the connection's owner could not be found (the client left, or its "
                "socket is not this host's): connect again from a running process",
            )
            return
        if self.admit is not None:
            allowed, why = self.admit(caller)
            if not allowed:
                self._refuse(sock, caller.uid, 403, "Forbidden", f"kerneld: {why}")
                return
        limits = self.limits
        slots = self._slots
        if not slots.may_take(caller.uid) and slots.holds(caller.uid):
            self._refuse(
                sock,
                caller.uid,
                503,
                "Service Unavailable",
                f"kerneld: uid {caller.uid} has {slots.holds(caller.uid)} connections open "
                f"to the {self.name} listener (its share while {len(slots.held)} users hold "
                f"{slots.used} of {slots.total}): close some (or reuse them) and retry",
            )
            return
        if not slots.may_take(caller.uid):
            self._refuse(
                sock,
                caller.uid,
                503,
                "Service Unavailable",
                f"kerneld: the {self.name} listener has {limits.max_connections} connections "
                "open: retry shortly",
            )
            return
        sock.setblocking(False)
        if listener.tcp:
            # headers and body go out in separate writes; Nagle would hold the body back
            # until the client's delayed ACK (~40 ms a request)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock, peer, caller, listener.where)
        conn.deadline = time.monotonic() + limits.head_deadline_s
        self._conns.add(conn)
        slots.take(caller.uid)
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _refuse(self, sock: socket.socket, uid: int, status: int, reason: str, why: str) -> None:
        """Answer a refused connection with one fixed line and close it; nothing of it read.
        A 403 (not admitted) past the uid's refusal budget is closed unanswered: an outsider's
        flood costs an accept and a close (a member's 503s all say why: it may retry)."""
        self._log_refusal(uid, why)
        if status == 403 and not self._refusals.allow(uid):
            sock.close()
            return
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(fixed_answer(status, reason, why))
            sock.shutdown(socket.SHUT_WR)
        if self._draining >= self.limits.max_refused_draining:
            sock.close()
            return
        # Keep it a moment, discarding what arrives: closed with its request unread, the
        # kernel would reset it and the client could lose the answer that says why.
        conn = _Conn(sock, None, Caller(), "")
        conn.draining = True
        conn.deadline = time.monotonic() + 1.0
        self._conns.add(conn)
        self._draining += 1
        try:
            self._selector.register(sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            self._forget(conn, registered=False)

    def _log_refusal(self, uid: int, why: str) -> None:
        """One line per uid and reason per 10 s (an outsider's flood does not flood the log)."""
        now = time.monotonic()
        key = (uid, why)
        last, suppressed = self._refused_log.get(key, (-1e9, 0))
        if now - last < 10.0:
            self._refused_log[key] = (last, suppressed + 1)
            return
        more = f" (and {suppressed} more in the last 10 s)" if suppressed else ""
        log.warning("%s: refused uid %d at accept: %s%s", self.name, uid, why, more)
        self._refused_log[key] = (now, 0)
        if len(self._refused_log) > 4096:
            self._refused_log.pop(next(iter(self._refused_log)))

    def _readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(16384)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget(conn)
            return
        if conn.draining:
            return
        if not conn.buf and not conn.in_head:  # the first byte of a later request
            conn.in_head = True
            conn.deadline = time.monotonic() + self.limits.head_deadline_s
        conn.buf += data
        self._try_dispatch(conn)

    def _try_dispatch(self, conn: _Conn) -> None:
        """A complete head, then its whole body, read here: only then is a worker taken."""
        if conn.request is None:
            try:
                size = check_head(conn.buf, self.limits)
                if size is None:
                    return
                head, conn.buf = conn.buf[:size], conn.buf[size:]
                conn.request, conn.need = read_head(conn.parser, head, self.limits)
            except HeadError as err:
                self._fail(conn, err.answer, str(err))
                return
            if conn.need:  # a body to come: its own, shorter deadline
                conn.deadline = time.monotonic() + self.limits.body_deadline_s
        if len(conn.buf) < conn.need:
            return
        request, need = conn.request, conn.need
        assert request is not None
        body, conn.buf = conn.buf[:need], conn.buf[need:]  # the rest: a pipelined request
        try:
            data = read_body(conn.parser, body)
        except (HeadError, h11.RemoteProtocolError) as err:
            self._fail(conn, fixed_answer(400, "Bad Request", f"kerneld: {err}"), str(err))
            return
        conn.request = None
        conn.need = 0
        conn.deadline = 0.0
        self._selector.unregister(conn.sock)
        self._submit(conn, request, data)

    def _submit(self, conn: _Conn, request: h11.Request, body: bytes) -> None:
        """Give the request a worker if its uid may take one now (`FairShare`); else it waits
        for one to come back (no uid's slow requests can take every worker from the others)."""
        uid = conn.caller.uid
        if not self._workers.may_take(uid):
            self._parked.setdefault(uid, deque()).append((conn, request, body))
            return
        self._workers.take(uid)
        try:
            self._pool.submit(self._serve, conn, request, body)
        except RuntimeError:  # shutting down
            self._workers.give(uid)
            self._forget(conn, registered=False)

    def _finished(self, uid: int) -> None:
        """One of `uid`'s requests gave its worker back: waiting requests that may take one
        now get it, the uids holding fewest workers first."""
        self._workers.give(uid)
        while self._parked:
            ready = [u for u in self._parked if self._workers.may_take(u)]
            if not ready:
                return
            first = min(ready, key=self._workers.holds)
            waiting = self._parked[first]
            conn, request, body = waiting.popleft()
            if not waiting:
                del self._parked[first]
            if conn in self._conns:
                self._submit(conn, request, body)

    def _fail(self, conn: _Conn, answer: bytes, why: str) -> None:
        log.info("%s: uid %d: %s; closed", self.name, conn.caller.uid, why)
        with contextlib.suppress(OSError):
            conn.sock.send(answer)
        self._forget(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns if 0 < c.deadline <= now]:
            if conn.draining:
                self._forget(conn)
            elif conn.request is not None:
                why = f"the request body did not arrive within {self.limits.body_deadline_s:g} s"
                self._fail(conn, fixed_answer(408, "Request Timeout", f"kerneld: {why}"), why)
            elif conn.in_head:
                why = f"no complete request head within {self.limits.head_deadline_s:g} s"
                self._fail(conn, fixed_answer(408, "Request Timeout", f"kerneld: {why}"), why)
            else:
                self._forget(conn)  # idle keep-alive

    def _take_returned(self) -> None:
        while True:
            try:
                conn, keep = self._returned.get_nowait()
            except queue.Empty:
                return
            self._finished(conn.caller.uid)
            # An answer that promised keep-alive, given while the front quiesces: its client
            # may be sending the next request already, which a close now would cut (a job's
            # failed download); that one is answered, with `Connection: close` (`_handle`).
            last = keep and self._quiescing.is_set() and not conn.last
            if not keep or self._stop.is_set() or (self._quiescing.is_set() and not last):
                self._forget(conn, registered=False)
                continue
            conn.last = last
            try:
                conn.sock.setblocking(False)
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError):
                self._forget(conn, registered=False)
                continue
            rest = conn.buf  # pipelined after the request just answered
            conn.in_head = bool(rest)
            idle = self.limits.drain_idle_s if last else self.limits.idle_timeout_s
            conn.deadline = time.monotonic() + (self.limits.head_deadline_s if rest else idle)
            if rest:
                self._try_dispatch(conn)

    def _forget(self, conn: _Conn, *, registered: bool = True) -> None:
        if registered:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(conn.sock)
        if conn in self._conns:
            self._conns.discard(conn)
            if conn.draining:
                self._draining -= 1
            else:
                self._slots.give(conn.caller.uid)
        conn.sock.close()

    # -- a worker -----------------------------------------------------------------------------

    def _serve(self, conn: _Conn, request: h11.Request, body: bytes) -> None:
        keep = False
        try:
            conn.sock.settimeout(self.limits.io_timeout_s)
            keep = self._handle(conn, request, body)
        except Exception as exc:  # the peer went away mid-answer, a handler bug
            log.debug("%s: uid %d: request ended: %s", self.name, conn.caller.uid, exc)
            keep = False
        finally:
            self._returned.put((conn, keep))
            self._wake()

    def _handle(self, conn: _Conn, request: h11.Request, body: bytes) -> bool:
        """Run the handler for one request; keep the connection open after it?"""
        peer = conn.peer[0] if isinstance(conn.peer, tuple) and conn.peer else "unix"
        exchange = Exchange(
            conn.parser, conn.sock, request, body, caller=conn.caller, peer=str(peer)
        )
        if self._quiescing.is_set() or conn.last:
            exchange.close = True  # stopping: the client must not reuse this connection
        if exchange.method not in self.handler.methods:
            why = f"kerneld: unsupported method ({exchange.method!r})"
            conn.sock.sendall(fixed_answer(501, "Not Implemented", why))
            return False
        try:
            self.handler(exchange)
        finally:
            if not exchange.started:  # a handler that failed before its answer
                conn.sock.sendall(
                    fixed_answer(500, "Internal Server Error", "kerneld: the request failed")
                )
                exchange.close = True
        return exchange.end()


def _unread(sock: socket.socket) -> bool:
    """Bytes wait in `sock`'s receive buffer, not yet read (a peer's close is not bytes)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing to read now (EAGAIN), or the connection is gone
        return False
