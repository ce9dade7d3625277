"""The daemon against the Hub-compatible test server: zero-I/O hits, outages, SIGTERM mid-fetch."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import (
    CPU,
    TIMEOUT,
    failure,
    http_get_unix,
    metric,
    ref,
    resolve_req,
    tree_files,
)
from tests.fixtures_hub import REPO, VARIANT, SyntheticHub
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

E = pb.ErrorCode


def expected(synthetic_hub: SyntheticHub, rev: str) -> dict[str, bytes]:
    prefix = f"build/{VARIANT}/"
    return {p[len(prefix) :]: d for p, d in synthetic_hub.variant_files(rev).items()}


def test_hits_do_no_upstream_io_and_an_outage_serves_stale_refs(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    metrics_sock = daemon_dir("kd-m-") / "metrics.sock"
    # The hits run under a TTL no machine outlasts, so a slow one cannot make them miss; the
    # outage then runs under a short one, applied by a reload (issue 55: no wall-clock race).
    long_ttl, short_ttl = 3600.0, 0.2
    d = make_daemon(
        hub_endpoint=hub_server.url,
        config={
            "resolve": {"ref_ttl": long_ttl},
            "fetch": {"attempts": 1},
            "metrics": {"socket": str(metrics_sock)},
        },
    )
    with d.kernels() as kernels, d.admin() as admin:
        first = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
        fetched_at = time.monotonic()
        assert first.fetched and first.upstream == "hub"
        assert first.commit == synthetic_hub.commits["v1"]
        assert tree_files(Path(first.path)) == expected(synthetic_hub, "v1")

        # Within the ref TTL a hit touches no upstream at all.
        hub_server.reset_counts()
        for _ in range(3):
            hit = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
            assert not hit.fetched and hit.path == first.path
        kernels.ListVariants(
            pb.ListVariantsRequest(kernel=ref(REPO, 1), platform=CPU, allow_fetch=True),
            timeout=TIMEOUT,
        )
        kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
        assert hub_server.total() == 0, hub_server.requests

        # Past the TTL with the Hub down: the last known commit is served, marked stale.
        hub_server.inject(Fault("*", "error", status=503))
        d.write_config({"resolve": {"ref_ttl": short_ttl}})
        assert admin.ReloadConfig(pb.ReloadConfigRequest(), timeout=TIMEOUT).changed
        time.sleep(max(0.0, short_ttl - (time.monotonic() - fetched_at)) + 0.1)
        stale = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
        assert stale.stale and not stale.fetched
        assert (stale.commit, stale.path) == (first.commit, first.path)
        status = kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
        (hub,) = status.upstreams
        assert not hub.reachable and "503" in hub.last_error
        refs = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT).refs
        assert any(r.ref == "v1" and r.stale for r in refs)
        # Not cached at all: the outage is the answer.
        code, detail = failure(kernels.Resolve, resolve_req(REPO, 2))
        assert (code, detail.code) == (grpc.StatusCode.UNAVAILABLE, E.UPSTREAM_UNAVAILABLE)
    assert "serving stale ref" in d.logs()
    assert metric(http_get_unix(metrics_sock), "kerneld_stale_serves_total") == 1


def _resolve_in_background(d: DaemonProcess, result: dict[str, object]) -> threading.Thread:
    def call() -> None:
        with d.kernels() as kernels:
            try:
                result["kernel"] = kernels.Resolve(resolve_req(REPO, 1), timeout=60).kernel
            except grpc.RpcError as exc:
                result["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _wait_for_download(hub_server: HubServer, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while hub_server.counts["resolve_get"] < 1:
        assert time.monotonic() < deadline, hub_server.requests
        time.sleep(0.02)


def test_sigterm_during_a_fetch_lets_it_finish(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    d = make_daemon(hub_endpoint=hub_server.url, config={"server": {"drain_timeout": "20s"}})
    hub_server.latency_s = 0.1
    result: dict[str, object] = {}
    thread = _resolve_in_background(d, result)
    _wait_for_download(hub_server)
    d.send_signal(signal.SIGTERM)
    thread.join(30)
    assert "kernel" in result, result
    kernel = result["kernel"]
    assert isinstance(kernel, pb.ResolvedKernel) and kernel.fetched
    assert d.wait() == 0
    assert "draining" in d.logs() and "drain timeout" not in d.logs()
    assert tree_files(Path(kernel.path)) == expected(synthetic_hub, "v1")


def test_sigterm_past_the_drain_timeout_leaves_no_partial_tree(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    d = make_daemon(hub_endpoint=hub_server.url, config={"server": {"drain_timeout": 0.1}})
    hub_server.latency_s = 0.3
    result: dict[str, object] = {}
    thread = _resolve_in_background(d, result)
    _wait_for_download(hub_server)
    d.send_signal(signal.SIGTERM)
    assert d.wait(timeout=15) == 0
    thread.join(30)
    assert isinstance(result.get("error"), grpc.RpcError), result
    assert "drain timeout" in d.logs()
    trees = d.store_root / "v1" / "trees"
    assert list(trees.iterdir()) == [], d.logs()  # nothing half-published is visible
    hub_server.latency_s = 0
    d.start()  # recovery cleans up; the same download now completes
    with d.admin() as admin:
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in events] == [pb.VerifyEvent.SUMMARY] and events[0].exit_mask == 0
    with d.kernels() as kernels:
        kernel = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
    assert kernel.fetched and tree_files(Path(kernel.path)) == expected(synthetic_hub, "v1")


class _Trap:
    """A loopback listener that records every connection made to it: set as the daemon's HTTP
    and HTTPS proxy, it receives whatever the daemon tries to reach besides loopback."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.seen.append(conn.recv(4096).split(b"\r\n", 1)[0])
                except OSError:
                    self.seen.append(b"(connected, sent nothing)")

    def close(self) -> None:
        self.sock.close()


def test_the_daemon_reaches_nothing_but_its_upstreams(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    """Issue 18: with a loopback `--hub-endpoint`, huggingface_hub's user-agent telemetry still
    fetched `https://huggingface.co/api/agent-harnesses` once. An air-gapped site must see no
    attempt to reach anything but its configured upstreams: every non-loopback request goes to
    a proxy that records it, and the test fails on any."""
    trap = _Trap()
    try:
        proxy = {
            name: trap.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy")
        }
        d = make_daemon(
            hub_endpoint=hub_server.url,
            env={**proxy, "https_proxy": trap.url, "NO_PROXY": "127.0.0.1,localhost"},
        )
        with d.kernels() as kernels, d.admin() as admin:
            kernel = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
            assert kernel.fetched
            list(admin.Prefetch(pb.PrefetchRequest(kernels=[ref(REPO, 2)]), timeout=TIMEOUT))
            kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
        d.stop()
        assert trap.seen == [], trap.seen
    finally:
        trap.close()
