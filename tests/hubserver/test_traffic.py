"""What the test Hub counts and injects: request and byte counters, reset, every fault kind and
the rate budget (the benchmark's and the client tests' levers)."""

from __future__ import annotations

import http.client
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures_hub import REPO, UNTRUSTED_ORG, SyntheticHub
from tests.hubserver.support import DATA, INIT, request, resolve_path
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import KINDS, Fault

# --- counters ------------------------------------------------------------------------------------


def test_counters_by_kind_and_path(hub_server: HubServer) -> None:
    request(hub_server, "GET", f"/api/kernels/{REPO}/refs")
    request(hub_server, "GET", f"/api/kernels/{REPO}/refs")
    request(hub_server, "GET", f"/api/kernels/{REPO}/revision/v1")
    request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1")
    request(hub_server, "POST", f"/api/kernels/{REPO}/paths-info/v1", body=b"paths=README.md")
    request(hub_server, "HEAD", resolve_path(REPO, "v1", INIT))
    request(hub_server, "GET", resolve_path(REPO, "v1", INIT))
    request(hub_server, "GET", "/api/organizations/kerneld-trusted/overview")
    request(hub_server, "GET", "/api/agent-harnesses")
    assert hub_server.counts == {
        "refs": 2,
        "info": 1,
        "tree": 1,
        "paths_info": 1,
        "resolve_head": 1,
        "resolve_get": 1,
        "org_overview": 1,
        "agent_harnesses": 1,
    }
    assert set(hub_server.counts) <= set(KINDS)
    assert hub_server.total() == 8
    assert hub_server.total(exclude=()) == 9
    assert hub_server.path_counts[f"GET /api/kernels/{REPO}/refs"] == 2
    assert hub_server.path_counts[f"HEAD /kernels/{REPO}/resolve/v1/{INIT}"] == 1
    assert [r.status for r in hub_server.requests][-1] == 404
    hub_server.reset_counts()
    assert hub_server.counts == {}
    assert hub_server.total() == 0
    assert hub_server.requests == []


def test_reset_restores_construction_state(hub_root: Path) -> None:
    with HubServer(hub_root, trusted_orgs={"a": True}, page_size=5, latency_s=0.01) as server:
        server.set_trusted("a", False)
        server.page_size, server.expand_page_size, server.latency_s = 1, 2, 3.0
        server.gated.add(REPO)
        server.inject(Fault(pattern="*", kind="error"))
        server.reset()
        assert (server.trusted_orgs, server.page_size, server.expand_page_size) == (
            {"a": True},
            5,
            50,
        )
        assert server.latency_s == 0.01
        assert server.gated == set()
        assert request(server, "GET", f"/api/kernels/{REPO}/refs").status == 200
        assert server.counts == {"refs": 1}


def test_counters_are_thread_safe(hub_server: HubServer) -> None:
    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", hub_server.port, timeout=10)
        for _ in range(25):
            conn.request("GET", f"/api/organizations/{UNTRUSTED_ORG}/overview")
            conn.getresponse().read()
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hub_server.counts["org_overview"] == 200
    assert len(hub_server.requests) == 200


# --- faults --------------------------------------------------------------------------------------


def test_fault_latency_once_and_global_latency(hub_server: HubServer) -> None:
    fault = hub_server.inject(Fault(pattern="*/refs", kind="latency", latency_s=0.2, times=1))
    path = f"/api/kernels/{REPO}/refs"
    t0 = time.perf_counter()
    assert request(hub_server, "GET", path).status == 200
    slow = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert request(hub_server, "GET", path).status == 200
    fast = time.perf_counter() - t0
    assert slow >= 0.2
    assert fast < 0.15
    assert fault.fired == 1 and fault.exhausted
    hub_server.latency_s = 0.05
    t0 = time.perf_counter()
    request(hub_server, "GET", "/api/agent-harnesses")
    assert time.perf_counter() - t0 >= 0.05


def test_fault_http_500_n_times(hub_server: HubServer) -> None:
    fault = hub_server.inject(Fault(pattern=f"/api/kernels/{REPO}/refs", kind="error", times=2))
    statuses = [request(hub_server, "GET", f"/api/kernels/{REPO}/refs").status for _ in range(3)]
    assert statuses == [500, 500, 200]
    assert fault.fired == 2
    assert hub_server.counts["refs"] == 3  # faulted requests are counted too


def test_fault_rate_limit_has_retry_after(hub_server: HubServer) -> None:
    hub_server.inject(Fault(pattern="*/resolve/*", kind="rate_limit", retry_after=7, method="HEAD"))
    head = request(hub_server, "HEAD", resolve_path(REPO, "v1", INIT))
    assert head.status == 429
    assert head.headers["Retry-After"] == "7"
    assert request(hub_server, "GET", resolve_path(REPO, "v1", INIT)).status == 200  # method filter


def test_fault_regex_pattern_and_clear(hub_server: HubServer) -> None:
    hub_server.inject(Fault(pattern=r"/tree/[^/]+$", kind="error", status=503, regex=True))
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1").status == 503
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1/build").status == 200
    hub_server.clear_faults()
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1").status == 200


def _get_data(server: HubServer) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", resolve_path(REPO, "v1", DATA))
    return conn.getresponse(), conn


def test_fault_reset_mid_body(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    fault = hub_server.inject(Fault(pattern="*/data.bin", kind="reset", times=1))
    assert request(hub_server, "HEAD", resolve_path(REPO, "v1", DATA)).status == 200
    assert fault.fired == 0  # body faults never fire on HEAD
    resp, conn = _get_data(hub_server)
    assert resp.status == 200
    with pytest.raises(ConnectionResetError):
        resp.read()
    conn.close()
    assert fault.fired == 1
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    assert request(hub_server, "GET", resolve_path(REPO, "v1", DATA)).body == content


def test_fault_truncated_body(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    hub_server.inject(Fault(pattern="*/data.bin", kind="truncate", times=1))
    resp, conn = _get_data(hub_server)
    assert resp.headers["Content-Length"] == str(len(content))
    with pytest.raises(http.client.IncompleteRead) as err:
        resp.read()
    conn.close()
    assert err.value.partial == content[: len(content) // 2]


def test_fault_corrupt_flips_one_byte(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    hub_server.inject(Fault(pattern="*/data.bin", kind="corrupt", times=1, corrupt_offset=123))
    body = request(hub_server, "GET", resolve_path(REPO, "v1", DATA)).body
    assert len(body) == len(content)
    diff = [i for i, (a, b) in enumerate(zip(body, content, strict=True)) if a != b]
    assert diff == [123]
    assert body[123] == content[123] ^ 0xFF
    assert request(hub_server, "GET", resolve_path(REPO, "v1", DATA)).body == content


def test_fault_without_times_fires_forever(hub_server: HubServer) -> None:
    fault = hub_server.inject(Fault(pattern="*/overview", kind="error", status=502))
    for _ in range(4):
        assert request(hub_server, "GET", "/api/organizations/x/overview").status == 502
    assert fault.fired == 4
    assert not fault.exhausted


# --- rate budget and byte counters (bench scenario 2) -----------------------------------------


def test_rate_budget_answers_429_with_retry_after_then_reopens(
    hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    budget = hub_server.set_rate_budget(2, window_s=1.0)
    assert budget is not None
    path = f"/api/kernels/{REPO}/refs"
    assert [request(hub_server, "GET", path).status for _ in range(2)] == [200, 200]
    refused = request(hub_server, "GET", path)
    assert refused.status == 429 and refused.headers["Retry-After"] == "1"
    assert budget.refused == 1
    time.sleep(1.05)  # the window is over: a new budget
    assert request(hub_server, "GET", path).status == 200
    hub_server.reset()
    assert all(request(hub_server, "GET", path).status == 200 for _ in range(4))


def test_bytes_sent_are_counted_by_kind(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    body = request(hub_server, "GET", resolve_path(REPO, "v1", INIT)).body
    assert hub_server.bytes_sent["resolve_get"] == len(body) > 0
    assert hub_server.total_bytes() == len(body), hub_server.records
