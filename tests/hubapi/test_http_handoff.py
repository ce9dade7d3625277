"""A restart hands the listening socket to the next daemon without failing a request.

kerneld.socket keeps the Hub API's socket while kerneld restarts; the stopping daemon's HTTP
front must answer every connection it accepted and accept no more (those wait in the backlog
for the next one). Played here with fronts on a socket the test holds (as systemd does), many
hand-overs under clients that connect every few milliseconds: any connection cut (a reset, an
empty answer) is a request a job lost. The daemon-level twin is
tests/daemon/test_socket_activation.py; tests/systemd/test_store_ops.py does it under systemd.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter

import pytest

from kerneld.server.fronts.httpfront.httpd import HttpFront
from kerneld.server.fronts.httpfront.httpexchange import Exchange
from kerneld.server.fronts.httpfront.httphead import HttpLimits
from kerneld.server.plumbing.peers import identify_peer

pytestmark = pytest.mark.timeout(120)
HANDOVERS = 25
CLIENTS = 8


class Answer:
    methods = frozenset({"GET"})

    def __call__(self, exchange: Exchange) -> None:
        exchange.respond(200, {"Content-Length": "2"}, b"ok")


def a_front(held: socket.socket) -> HttpFront:
    """A daemon's front on its own copy of the held socket (what systemd passes)."""
    f = HttpFront("handoff", Answer(), identify=identify_peer, limits=HttpLimits())
    f.add(socket.socket(fileno=os.dup(held.fileno())), "held", tcp=True, listening=True)
    f.start()
    return f


def ask(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(b"GET /x HTTP/1.0\r\n\r\n")
            line = s.makefile("rb").readline().split()
            return line[1].decode() if len(line) > 1 else "no answer"
    except OSError as exc:
        return f"error {exc}"


def test_many_handovers_under_load_lose_no_request() -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(socket.SOMAXCONN)
    port = held.getsockname()[1]
    got: Counter[str] = Counter()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            got[ask(port)] += 1
            time.sleep(0.002)

    clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
    front = a_front(held)
    for t in clients:
        t.start()
    try:
        for _ in range(HANDOVERS):
            time.sleep(0.05)
            front.stop(grace=10.0)
            front = a_front(held)
        time.sleep(0.05)
    finally:
        stop.set()
        for t in clients:
            t.join(30)
        front.stop()
        held.close()
    assert set(got) == {"200"}, got
    assert got["200"] >= HANDOVERS * 2, got


class Held(Answer):
    """Answers /slow only once released: a download in flight when the daemon stops."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, exchange: Exchange) -> None:
        if exchange.target == "/slow":
            self.entered.set()
            assert self.release.wait(10)
        super().__call__(exchange)


def read_answer(s: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one answer on a kept-alive connection (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "the connection closed in the body"
        body += chunk
    return head, body


def test_a_keep_alive_client_is_answered_through_a_stop() -> None:
    """A client (huggingface_hub's, kernels' downloads) that got a keep-alive answer while the
    daemon stops sends its next request on that connection at once: the stopping front must
    answer it, saying `Connection: close`, not cut the connection under it (the job's
    download would fail; tests/systemd/test_store_ops.py saw one in a restart)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(socket.SOMAXCONN)
    handler = Held()
    front = HttpFront("handoff", handler, identify=identify_peer, limits=HttpLimits())
    front.add(socket.socket(fileno=os.dup(held.fileno())), "held", tcp=True, listening=True)
    front.start()
    stopper = threading.Thread(target=front.stop, kwargs={"grace": 10.0})
    try:
        with socket.create_connection(held.getsockname(), timeout=10) as s:
            s.sendall(b"GET /slow HTTP/1.1\r\nHost: kerneld\r\n\r\n")
            assert handler.entered.wait(10)
            stopper.start()  # the daemon stops while the answer is being made
            assert front._quiesced.wait(10)  # its listeners are closed
            handler.release.set()
            head, body = read_answer(s)
            assert head.startswith(b"HTTP/1.1 200") and body == b"ok", head
            assert b"connection: close" not in head.lower(), head  # it promised keep-alive
            s.sendall(b"GET /next HTTP/1.1\r\nHost: kerneld\r\n\r\n")
            head, body = read_answer(s)
            assert head.startswith(b"HTTP/1.1 200") and body == b"ok", head
            assert b"connection: close" in head.lower(), head
            assert s.recv(1) == b""  # then closed, as it said
        stopper.join(15)
        assert not stopper.is_alive()
    finally:
        handler.release.set()
        if stopper.is_alive():
            stopper.join(15)
        held.close()
