"""Request heads of the daemon's HTTP listeners: the limits, the strict check of a head
before anything parses it, and the request's body reader and answer writer (httpd.py)."""

from __future__ import annotations

import io
import socket
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HttpLimits:
    """What one listener gives its peers before and while it answers them."""

    #: Request line plus headers, CRLFs included: a Hub client's head is ~300 bytes.
    head_bytes: int = 8192
    #: Header lines (the request line not counted).
    max_headers: int = 64
    #: From a connection's accept, or the first byte of a later request, to its blank line.
    head_deadline_s: float = 5.0
    #: A keep-alive connection with no request in flight is closed after this.
    idle_timeout_s: float = 30.0
    #: One send or body read of an answer in progress (a stalled reader loses its worker).
    io_timeout_s: float = 30.0
    #: Open connections of the listener group, and of one uid: file descriptors, not threads.
    #: One uid may have what the whole listener had before (256; a 64-rank job downloading
    #: with huggingface_hub's 8 threads a rank peaks near that); another always finds 256.
    max_connections: int = 512
    per_uid_connections: int = 256
    #: Threads answering requests (the unit's TasksMax=512 also covers gRPC and fetches), and
    #: how many of them one uid's requests may hold at once (the rest of its requests wait).
    workers: int = 32
    per_uid_workers: int = 16
    #: Fair shares (`kerneld.server.httpshare`): connections and workers kept for uids that
    #: hold fewer than the newcomer's part, so that no two uids can take them all.
    reserve_connections: int = 64
    newcomer_connections: int = 8
    reserve_workers: int = 8
    newcomer_workers: int = 2
    #: A request body is read whole by the poller before a worker is taken: at most this many
    #: bytes (a paths-info query is ~100), within this long of the end of its head.
    body_bytes: int = 64 * 1024
    body_deadline_s: float = 5.0
    #: Refused connections kept a moment so that their short answer is read, not reset.
    max_refused_draining: int = 64
    #: Refusals answered per second per uid; past that a refused connection is closed
    #: unanswered (an outsider's connect flood costs an accept and a close).
    refusals_per_s: float = 32.0


def fixed_answer(status: int, reason: str, message: str) -> bytes:
    body = (message + "\n").encode("ascii", "replace")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nServer: kerneld\r\nConnection: close\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        f"X-Error-Message: {message}\r\n\r\n"
    )
    return head.encode("ascii", "replace") + body


class HeadError(Exception):
    """A request head the listener will not parse: the answer and why."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.answer = fixed_answer(status, reason, message)


def check_head(buf: bytes, limits: HttpLimits) -> int | None:
    """The length of the complete head at the start of `buf` (through its blank line), None
    while it is incomplete; HeadError when it is too large or malformed. Lines end in CRLF: a
    bare CR or bare LF is refused (400), as are NUL and obsolete line folding."""
    end = buf.find(b"\r\n\r\n", 0, limits.head_bytes + 4)
    if end < 0:
        if len(buf) > limits.head_bytes:
            raise HeadError(
                431,
                "Request Header Fields Too Large",
                f"the request line and headers exceed {limits.head_bytes} bytes",
            )
        head = buf[:-1] if buf.endswith(b"\r") else buf  # its LF may be still to come
    else:
        head = buf[: end + 2]
    lf = head.count(b"\n")
    if head.count(b"\r") != lf or head.count(b"\r\n") != lf:
        raise HeadError(400, "Bad Request", "a bare CR or LF in the request head")
    if b"\0" in head:
        raise HeadError(400, "Bad Request", "a NUL byte in the request head")
    if b"\r\n " in head or b"\r\n\t" in head or head[:1] in (b" ", b"\t"):
        raise HeadError(400, "Bad Request", "obsolete line folding in the request head")
    if head.count(b"\r\n") - 1 > limits.max_headers:
        raise HeadError(
            431, "Request Header Fields Too Large", f"more than {limits.max_headers} headers"
        )
    return None if end < 0 else end + 4


def body_length(head: bytes, limits: HttpLimits) -> int:
    """The length of the body a complete head announces (0: none); HeadError for a chunked
    body (411: its length must be known before a worker is taken), a length past
    `limits.body_bytes` (413) or a malformed or contradictory Content-Length (400)."""
    lengths: set[str] = set()
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.strip().lower()
        if key == b"transfer-encoding":
            raise HeadError(
                411,
                "Length Required",
                "kerneld: a request body must come with a Content-Length (chunked "
                "Transfer-Encoding is not accepted)",
            )
        if key == b"content-length":
            lengths.add(value.strip().decode("latin-1"))
    if not lengths:
        return 0
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise HeadError(400, "Bad Request", "kerneld: a malformed or repeated Content-Length")
    length = int(lengths.pop())
    if length > limits.body_bytes:
        raise HeadError(
            413,
            "Content Too Large",
            f"kerneld: a request body of {length} bytes; this endpoint takes at most "
            f"{limits.body_bytes}",
        )
    return length


class BodyReader(io.RawIOBase):
    """`rfile` of a request: the bytes after its head already read, then the socket. Reads
    only what is asked (a pipelined next request stays for the poller)."""

    def __init__(self, sock: socket.socket, rest: bytes, deadline_s: float) -> None:
        """`deadline_s`: the whole body must arrive in this long (a body trickled a byte per
        socket timeout would otherwise hold its worker for hours)."""
        self.sock = sock
        self.rest = rest
        self.deadline = time.monotonic() + deadline_s

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if self.rest:
            n = min(len(view), len(self.rest))
            view[:n] = self.rest[:n]
            self.rest = self.rest[n:]
            return n
        if time.monotonic() > self.deadline:
            raise TimeoutError("the request body did not arrive in time")
        return self.sock.recv_into(view)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise ValueError("a request body is read by its Content-Length")
        out = bytearray()
        while len(out) < size:
            chunk = bytearray(size - len(out))
            n = self.readinto(chunk)
            if not n:
                break
            out += chunk[:n]
        return bytes(out)


class SocketWriter(io.RawIOBase):
    """`wfile` of a request: every write goes out whole (sendall, under the io timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.sock.sendall(b)
        return len(memoryview(b))
