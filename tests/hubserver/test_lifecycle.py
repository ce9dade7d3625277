"""The test Hub starts fast, hands out free ports, stops cleanly (keep-alive connections
included) and serves a root from the command line."""

from __future__ import annotations

import http.client
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.fixtures_hub import REPO, UNTRUSTED_ORG
from tests.hubserver.support import request
from tests.support.hubserver import HubServer


def test_starts_fast_on_loopback_and_stops(hub_root: Path) -> None:
    server = HubServer(hub_root).start()
    try:
        assert server.start_seconds is not None and server.start_seconds < 0.5
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert request(server, "GET", f"/api/kernels/{REPO}/refs").status == 200
    finally:
        server.stop()
    with pytest.raises(ConnectionRefusedError):
        request(server, "GET", f"/api/kernels/{REPO}/refs")


def test_context_manager_gives_distinct_free_ports(hub_root: Path) -> None:
    with HubServer(hub_root) as a, HubServer(hub_root) as b:
        assert a.port != b.port
        assert request(a, "GET", "/api/agent-harnesses").status == 404
        assert request(b, "GET", "/api/agent-harnesses").status == 404


def test_stop_closes_idle_keepalive_connections(hub_root: Path) -> None:
    server = HubServer(hub_root).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", f"/api/kernels/{REPO}/refs")
    conn.getresponse().read()
    server.stop()
    conn.sock.settimeout(5)
    assert conn.sock.recv(1) == b""  # the server closed its end; stop() did not hang on it
    conn.close()


def test_keepalive_requests_do_not_stall(hub_server: HubServer) -> None:
    """Without disable_nagle_algorithm, each keep-alive response waits ~40 ms for delayed ACKs."""
    conn = http.client.HTTPConnection("127.0.0.1", hub_server.port, timeout=5)
    times, socks = [], set()
    for _ in range(15):
        t0 = time.perf_counter()
        conn.request("GET", f"/api/organizations/{UNTRUSTED_ORG}/overview")
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read()
        times.append(time.perf_counter() - t0)
        socks.add(id(conn.sock))
    conn.close()
    assert len(socks) == 1, "connection was not kept alive"
    assert statistics.median(times) < 0.02, times


def test_cli_serves_root(hub_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hubserver", str(hub_root), "--trust", UNTRUSTED_ORG],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        parsed = urlsplit(url)
        assert parsed.hostname == "127.0.0.1"
        conn = http.client.HTTPConnection("127.0.0.1", parsed.port, timeout=5)
        conn.request("GET", f"/api/organizations/{UNTRUSTED_ORG}/overview")
        assert json.loads(conn.getresponse().read())["trustedKernelPublisher"] is True
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=5)
