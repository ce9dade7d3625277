"""Request heads of the daemon's HTTP listeners: the limits, the strict check of a head's bytes
before anything parses it, and the head and body parsed by h11 (a maintained sans-IO HTTP/1.1
parser) within those limits (httpd.py)."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

import h11

from kerneld.errors import ErrorKind


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
    #: While the daemon stops: how long a connection whose last answer promised keep-alive
    #: stays open for the request its client may already be sending (that one is answered,
    #: with `Connection: close`), rather than be cut under it.
    drain_idle_s: float = 1.0
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
    #: Fair shares (`kerneld.server.fronts.httpfront.httpshare`): connections and workers kept for
    #: uids that hold fewer than the newcomer's part, so that no two uids can take them all.
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

    kind = ErrorKind.INVALID  # each its own HTTP status: 400, 411, 413, 431, 505

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


def read_head(parser: h11.Connection, head: bytes, limits: HttpLimits) -> tuple[h11.Request, int]:
    """Parse a complete head `check_head` passed with the connection's h11 parser: the request
    and the length of the body it announces (0: none). HeadError for what h11 refuses (400,
    431), an HTTP version other than 1.0 and 1.1 (505), a chunked or other Transfer-Encoding
    (411: a body's length must be known before a worker is taken) and a Content-Length past
    `limits.body_bytes` (413)."""
    parser.receive_data(head)
    try:
        event = parser.next_event()
    except h11.RemoteProtocolError as exc:
        if _announces_transfer_encoding(head):
            raise _length_required() from None
        status = exc.error_status_hint
        text = str(exc)
        raise HeadError(
            status,
            HTTPStatus(status).phrase,
            f"kerneld: a malformed request head ({text[:120]}{'...' if len(text) > 120 else ''})",
        ) from None
    if not isinstance(event, h11.Request):  # a head of blank lines only
        raise HeadError(400, "Bad Request", "kerneld: a request line is METHOD TARGET HTTP/1.x")
    if event.http_version not in (b"1.0", b"1.1"):
        raise HeadError(
            505,
            "HTTP Version Not Supported",
            f"kerneld: HTTP/{event.http_version.decode()} is not spoken here (HTTP/1.1 is)",
        )
    length = 0
    for name, value in event.headers:
        if name == b"transfer-encoding":
            raise _length_required()
        if name == b"content-length":  # h11 checked it: digits, one value
            length = int(value)
    if length > limits.body_bytes:
        raise HeadError(
            413,
            "Content Too Large",
            f"kerneld: a request body of {length} bytes; this endpoint takes at most "
            f"{limits.body_bytes}",
        )
    return event, length


def read_body(parser: h11.Connection, body: bytes) -> bytes:
    """The whole body of the request `read_head` returned (its announced length read): h11's
    Data events up to its EndOfMessage."""
    if body:  # (no bytes would tell h11 the connection ended)
        parser.receive_data(body)
    out = bytearray()
    while True:
        event = parser.next_event()
        if isinstance(event, h11.Data):
            out += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(out)
        else:  # cannot happen: the bytes fed are exactly the announced length
            raise HeadError(400, "Bad Request", f"kerneld: a request body ended early ({event})")


def _length_required() -> HeadError:
    return HeadError(
        411,
        "Length Required",
        "kerneld: a request body must come with a Content-Length (chunked Transfer-Encoding "
        "is not accepted)",
    )


def _announces_transfer_encoding(head: bytes) -> bool:
    """Names a header line of `head` Transfer-Encoding? (h11 refuses all but chunked itself,
    with a 501 that would not say what to do.)"""
    for line in head.split(b"\r\n")[1:]:
        name, sep, _ = line.partition(b":")
        if sep and name.strip().lower() == b"transfer-encoding":
            return True
    return False
