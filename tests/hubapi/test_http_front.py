"""The daemon's HTTP front (kerneld/server/fronts/httpfront/httpd.py), on real loopback sockets with
real peers: identity at accept before a byte is read, bounded heads with their own deadline, per-uid
caps, and connections that cost descriptors, not threads."""

from __future__ import annotations

import os
import pwd
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kerneld.server.fronts.httpfront.httpd import HttpFront
from kerneld.server.fronts.httpfront.httpexchange import Exchange
from kerneld.server.fronts.httpfront.httphead import HttpLimits, check_head
from kerneld.server.plumbing.peers import identify_peer
from tests.security.support import NOBODY, as_user, needs_root

TESTER = pwd.getpwnam("kerneld-tester")


class Echo:
    """Answers 200 with the uid the listener named; counts what it served."""

    methods = frozenset({"GET"})

    def __init__(self) -> None:
        self.served: list[int] = []
        self.release = threading.Event()

    def __call__(self, exchange: Exchange) -> None:
        caller = exchange.caller
        if exchange.target == "/slow":
            assert self.release.wait(10)
        self.served.append(caller.uid)
        body = str(caller.uid).encode()
        exchange.respond(200, {"Content-Length": str(len(body))}, body)


@contextmanager
def front(start: bool = True, **limits: Any) -> Iterator[tuple[HttpFront, int, Echo]]:
    handler = Echo()
    refused = {NOBODY.pw_uid} if limits.pop("refuse_nobody", False) else set()
    f = HttpFront(
        "test",
        handler,
        identify=identify_peer,
        admit=lambda c: (c.uid not in refused, f"uid {c.uid} is not a member"),
        limits=HttpLimits(**limits),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    f.add(sock, "test", tcp=True)
    port = sock.getsockname()[1]
    if start:
        f.start()
    try:
        yield f, port, handler
    finally:
        f.stop()


def exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def read_answer(s: socket.socket) -> bytes:
    """One whole answer from a kept-alive connection (head, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += s.recv(4096)
    return head + b"\r\n\r\n" + body


GET = b"GET /x HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"


def test_heads_are_bounded_and_strict() -> None:
    with front() as (_, port, handler):
        assert exchange(port, GET).startswith(b"HTTP/1.1 200")
        big = b"GET /x HTTP/1.1\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n"
        assert exchange(port, big).startswith(b"HTTP/1.1 431")
        bare_cr = b"GET /x HTTP/1.1\r\nX-A: a\rb\r\nConnection: close\r\n\r\n"
        assert exchange(port, bare_cr).startswith(b"HTTP/1.1 400")
        bare_lf = b"GET /x HTTP/1.1\nConnection: close\n\n"
        assert exchange(port, bare_lf).startswith(b"HTTP/1.1 400")
        many = b"GET /x HTTP/1.1\r\n" + b"X: y\r\n" * 65 + b"\r\n"
        assert exchange(port, many).startswith(b"HTTP/1.1 431")
        assert len(handler.served) == 1  # none of the refused heads reached a handler


def test_the_head_deadline_is_separate_from_the_idle_timeout() -> None:
    with front(head_deadline_s=0.5, idle_timeout_s=5.0) as (_, port, handler):
        # a head trickled past its deadline: 408, closed
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /x HTTP/1.1\r\n")
            time.sleep(0.9)
            assert s.recv(4096).startswith(b"HTTP/1.1 408")
        # a keep-alive connection idle for longer than the head deadline still serves
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: k\r\n\r\n")
            assert read_answer(s).startswith(b"HTTP/1.1 200")
            time.sleep(1.2)
            s.sendall(GET)
            assert read_answer(s).startswith(b"HTTP/1.1 200")
        # pipelined requests are answered in order, from one read
        answer = exchange(port, b"GET /a HTTP/1.1\r\nHost: k\r\n\r\n" + GET)
        assert answer.count(b"HTTP/1.1 200") == 2
        assert len(handler.served) == 4


def test_idle_connections_cost_no_threads() -> None:
    before = threading.active_count()
    with front(workers=4) as (_, port, _handler):
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
        try:
            for s in held:
                s.sendall(b"GET /x HTTP/1.1\r\nHost: k\r\n\r\n")
            for s in held:
                assert read_answer(s).startswith(b"HTTP/1.1 200")
            assert threading.active_count() - before <= 4 + 1  # the workers and the poller
        finally:
            for s in held:
                s.close()


@needs_root
def test_a_peer_gone_before_accept_is_refused_not_served_as_root() -> None:
    """The orphaned-socket race: a client sends its request and closes before the daemon
    accepts. The kernel then reports its end with uid 0 and no inode; that must not be root."""
    with front(start=False) as (f, port, handler):

        def hit_and_run() -> None:
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(GET)

        as_user(NOBODY.pw_uid, NOBODY.pw_gid, hit_and_run)
        f.start()  # the five are accepted now, their clients long gone
        time.sleep(0.5)
        assert handler.served == []

        def live() -> str:
            return exchange(port, GET).decode()

        answer = as_user(NOBODY.pw_uid, NOBODY.pw_gid, live)
        assert answer.startswith("HTTP/1.1 200") and answer.endswith(str(NOBODY.pw_uid))
        assert handler.served == [NOBODY.pw_uid]


@needs_root
def test_non_members_are_answered_and_closed_at_accept_and_caps_are_per_uid() -> None:
    with front(refuse_nobody=True, per_uid_connections=3) as (_, port, handler):

        def outsider() -> str:
            return exchange(port, GET).decode()

        answer = as_user(NOBODY.pw_uid, NOBODY.pw_gid, outsider)
        assert answer.startswith("HTTP/1.1 403") and "not a member" in answer
        # root holds its 3 connections; a 4th is refused with why, another uid is not held up
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        try:
            time.sleep(0.2)
            answer = exchange(port, GET).decode()
            assert answer.startswith("HTTP/1.1 503") and "uid 0 has 3 connections" in answer
            got = as_user(TESTER.pw_uid, TESTER.pw_gid, lambda: exchange(port, GET).decode())
            assert got.startswith("HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        assert handler.served == [TESTER.pw_uid]


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 18),
        (b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest", 24),
        (b"GET / HTTP/1.1\r\nA: b\r", None),  # the CR of a CRLF still to come
        (b"GET / HTTP/1.1\r\nA: b", None),
    ],
)
def test_check_head(data: bytes, want: int | None) -> None:
    assert check_head(data, HttpLimits()) == want


def test_uid_of_this_process_is_named_over_tcp() -> None:
    with front() as (_, port, _handler):
        answer = exchange(port, GET)
        assert answer.endswith(str(os.geteuid()).encode())


@needs_root
def test_one_uid_holds_at_most_its_share_of_the_workers() -> None:
    """Root's four stalled requests hold two of the four workers (its share); the other two
    wait for root's own to finish, and another uid is answered meanwhile."""
    with front(workers=4, per_uid_workers=2) as (_, port, handler):
        slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
        try:
            for s in slow:
                s.sendall(b"GET /slow HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
            time.sleep(0.3)
            start = time.monotonic()
            got = as_user(TESTER.pw_uid, TESTER.pw_gid, lambda: exchange(port, GET).decode())
            assert got.startswith("HTTP/1.1 200") and time.monotonic() - start < 2
            handler.release.set()
            for s in slow:
                assert read_answer(s).startswith(b"HTTP/1.1 200")
        finally:
            handler.release.set()
            for s in slow:
                s.close()
        assert sorted(handler.served) == [0, 0, 0, 0, TESTER.pw_uid]
