"""One request of the daemon's HTTP front and its answer, as a handler sees them: what was
asked (method, target, headers, the body already read whole) and who asked (the caller named
at accept), and an answer written through the connection's h11 parser, which frames it (its
Content-Length, `Connection: close` when the connection ends, no body to a HEAD).

A handler is any object with `methods` (the methods it answers; the front answers any other
with a 501) that is called with one `Exchange` per request
(`kerneld/server/fronts/httpfront/httpd.py`).
"""

from __future__ import annotations

import email.utils
import socket
import time
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Protocol

import h11

from kerneld.server.plumbing.identity import Caller

Headers = Mapping[str, str] | Iterable[tuple[str, str]]

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class HttpHandler(Protocol):
    """What the HTTP front runs for each request."""

    #: The methods answered (upper case); any other gets the front's 501.
    methods: frozenset[str]

    def __call__(self, exchange: Exchange) -> None: ...


class _Date:
    """The Date header's value, made once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.value = email.utils.formatdate(second, usegmt=True).encode()
            cls.second = second
        return cls.value


class Exchange:
    """One request (read whole by the front before this was made) and its answer."""

    __slots__ = (
        "_parser",
        "_pending",
        "_sock",
        "body",
        "caller",
        "close",
        "ended",
        "headers",
        "method",
        "peer",
        "server",
        "started",
        "status",
        "target",
        "version",
    )

    def __init__(
        self,
        parser: h11.Connection,
        sock: socket.socket,
        request: h11.Request,
        body: bytes,
        *,
        caller: Caller,
        peer: str,
        server: str = "kerneld",
    ) -> None:
        self._parser = parser
        self._sock = sock
        self._pending: list[bytes] = []  # the answer's head, sent with its first body bytes
        #: As sent (h11 checked its grammar), e.g. "GET"; the target as sent, query included.
        self.method = request.method.decode("ascii")
        self.target = request.target.decode("latin-1")
        self.version = request.http_version.decode("ascii")
        #: (lower-case name, value) in the order sent.
        self.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in request.headers]
        self.body = body
        #: Named at accept, before a byte of the connection was read.
        self.caller = caller
        #: "unix", or the peer's IP address.
        self.peer = peer
        self.server = server.encode()
        #: Set by a handler: close the connection after this answer.
        self.close = False
        self.started = False
        self.ended = False
        self.status = 0

    def header(self, name: str) -> str | None:
        """The first value of header `name` (any case), None when it was not sent."""
        key = name.lower()
        for n, v in self.headers:
            if n == key:
                return v
        return None

    def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        """The whole answer: status, headers (give its Content-Length) and body."""
        self.start(status, headers)
        if body:
            self.write(body)

    def start(self, status: int, headers: Headers) -> None:
        """The answer's status and headers (sent with the first `write`, or at its end)."""
        items = headers.items() if isinstance(headers, Mapping) else headers
        fields = [(b"Server", self.server), (b"Date", _Date.now())]
        fields += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in items]
        if self.close:
            fields.append((b"Connection", b"close"))
        response = h11.Response(
            status_code=status, headers=fields, reason=_REASONS.get(status, b"")
        )
        self._pending.append(self._parser.send(response) or b"")
        self.started = True
        self.status = status

    def write(self, data: bytes) -> None:
        """Body bytes of the answer (none for a HEAD: h11 frames its length as 0)."""
        if self.method == "HEAD" or not data:
            return
        parts = self._parser.send_with_data_passthrough(h11.Data(data=data)) or []
        self._send([*self._pending, *parts])
        self._pending = []

    def end(self) -> bool:
        """End the answer; may the connection carry another request? (No when the answer was
        cut short, the client or the handler asked to close, or the client spoke HTTP/1.0.)"""
        if self.ended:
            return False
        self.ended = True
        try:
            self._pending.append(self._parser.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # fewer bytes than its Content-Length: cut short
            self._send(self._pending)
            return False
        self._send(self._pending)
        self._pending = []
        parser = self._parser
        if self.close or parser.our_state is not h11.DONE or parser.their_state is not h11.DONE:
            return False
        parser.start_next_cycle()
        return True

    def _send(self, parts: list[bytes]) -> None:
        """All of `parts` in one system call where it can (head and body together)."""
        parts = [p for p in parts if p]
        if len(parts) == 1:
            self._sock.sendall(parts[0])
        elif parts:
            sent = self._sock.sendmsg(parts)
            if sent < sum(len(p) for p in parts):
                self._sock.sendall(b"".join(parts)[sent:])
