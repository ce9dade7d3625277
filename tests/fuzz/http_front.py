"""Harness for the HTTP front of the Hub endpoint and the metrics listener (`httpd.py`,
`httphead.py`), shared by `tests/fuzz/test_http_front.py` and `fuzz/fuzz_http.py`.

A real `HttpFront` on a loopback port (peers named by the kernel, as deployed) runs a handler
that applies the endpoint's own request parsing to what it gets: the path split and routed to
its metrics label (`route_label`), every part percent-decoded as the routes do, the repo id
checked when the route names one, and the `Range` header against a 1,000-byte file
(`parse_range`). The invariants, for any bytes sent as a request:

- an answer comes back (408 for a head or an announced body that never completes), with a status
  line the front or the handler may give;
- `check_head` raises nothing but `HeadError`, and a head it accepts is CRLF-clean, within the
  limits and ends in a blank line;
- a range it honours lies in the file; a route label is one of the endpoint's;
- the front still answers a valid request afterwards, with no more threads than its workers.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import unquote, urlsplit

from kerneld.server.fronts.httpfront.httpd import HttpFront
from kerneld.server.fronts.httpfront.httpexchange import Exchange
from kerneld.server.fronts.httpfront.httphead import HeadError, HttpLimits, check_head
from kerneld.server.fronts.hubapi.server import parse_range, route_label
from kerneld.server.plumbing.peers import identify_peer
from kerneld.upstream.base import check_repo_id

FILE_SIZE = 1000
ROUTES = {"info", "refs", "tree", "paths_info", "file", "org_overview", "other"}
STATUSES = {200, 206, 400, 404, 408, 411, 413, 416, 431, 501, 505}
#: Short deadlines for a head, or a body a head announces, that never completes: their 408 must
#: come well inside the harness's 5 s wait for an answer (at the 5 s default the two raced).
LIMITS = HttpLimits(head_deadline_s=0.3, body_deadline_s=0.5, workers=4)
VALID = b"GET /api/kernels/org/name HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"


class RoutingHandler:
    methods = frozenset({"GET", "HEAD", "POST"})

    def __call__(self, exchange: Exchange) -> None:
        split = urlsplit(exchange.target)
        parts = split.path.split("/")
        route = route_label(split.path)
        assert route in ROUTES, route
        for part in parts:
            unquote(part)
        if route in ("info", "refs", "tree", "paths_info") or route == "file":
            first = 3 if route != "file" else 2
            try:
                check_repo_id(f"{unquote(parts[first])}/{unquote(parts[first + 1])}")
            except ValueError:
                return exchange.respond(404, {"Content-Length": "8"}, b"bad repo")
        status, body = 200, route.encode()
        rng = exchange.header("Range")
        if rng is not None:
            got = parse_range(rng, FILE_SIZE)
            if got is None:
                status = 416
            elif got != "all":
                start, end = got
                assert 0 <= start < end <= FILE_SIZE, (rng, got)
                status, body = 206, b"x" * (end - start)
        exchange.respond(status, {"Content-Length": str(len(body))}, body)


class FrontHarness:
    def __init__(self) -> None:
        self.front = HttpFront("fuzz", RoutingHandler(), identify=identify_peer, limits=LIMITS)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.front.add(sock, "fuzz", tcp=True)
        self.port = sock.getsockname()[1]
        self.threads_before = threading.active_count()
        self.front.start()

    def close(self) -> None:
        self.front.stop()

    def exchange(self, data: bytes) -> bytes:
        """Send `data` on a fresh connection (kept open: a client that half-closes before it
        is accepted is refused, as gone); what comes back until the server closes or stays
        quiet for 0.2 s after answering."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            with contextlib.suppress(OSError):  # refused part way: the answer is still there
                s.sendall(data)
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
                    s.settimeout(0.2)
            except (TimeoutError, ConnectionResetError):
                pass
            return out

    def check(self, data: bytes) -> None:
        check_head_invariants(data)
        answer = self.exchange(data)
        line = answer.split(b"\r\n", 1)[0]
        assert line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), (data[:200], answer[:200])
        assert int(line.split()[1]) in STATUSES, line
        assert self.exchange(VALID).startswith(b"HTTP/1.1 200")
        assert threading.active_count() <= self.threads_before + LIMITS.workers + 1


def check_head_invariants(data: bytes) -> None:
    try:
        size = check_head(data, LIMITS)
    except HeadError as err:
        assert err.answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), err.answer
        return
    if size is None:
        return
    head = data[:size]
    assert head.endswith(b"\r\n\r\n") and size <= LIMITS.head_bytes + 4
    assert head.count(b"\r") == head.count(b"\n") == head.count(b"\r\n")
    assert b"\0" not in head
