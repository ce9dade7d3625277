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
