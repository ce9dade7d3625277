"""A job's wait is bounded by its own deadline whatever the upstream does (issue 16, 3.6).

A real daemon whose Hub endpoint is a loopback port nobody listens on (refused at once) or a
server that accepts connections and never answers (a black hole, as a firewall that drops
packets after the handshake). The caller's gRPC deadline reaches the daemon, which answers
within it, naming every upstream and what each said; huggingface_hub's own retries (5 per call,
~23 s on a DNS or connect failure) no longer run under kerneld's.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kerneld.upstream.errors import UpstreamUnavailable
from kerneld.upstream.retry import (
    RetryPolicy,
    TransientError,
    recent_failure,
    request_timeout,
    with_retries,
)
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import CPU, TIMEOUT, failure, resolve_req
from tests.fixtures_hub import REPO
from tests.support.daemon import REPO_ROOT, DaemonProcess
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

E = pb.ErrorCode
MISSING = "kerneld-test/not-on-this-host"
#: What a loaded 2-core CI machine may add to an answer given at the deadline.
SLACK_S = 0.75


class BlackHole:
    """A TCP server on 127.0.0.1 that accepts every connection, reads, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)  # open, never written to

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self.sock.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    server = BlackHole()
    yield server
    server.close()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: a connect is refused (RST) at once,
    and no other process can take the port while the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _timed_failure(
    call: Callable[..., object], request: pb.ResolveRequest, timeout: float
) -> tuple[float, grpc.StatusCode, pb.ErrorDetail]:
    start = time.monotonic()
    code, detail = failure(call, request, timeout=timeout)
    return time.monotonic() - start, code, detail


def test_a_refused_hub_is_recognised_at_once_and_named(
    make_daemon: Callable[..., DaemonProcess], refused_port: int
) -> None:
    """Connection refused: 2 quick attempts, not 4 x huggingface_hub's 5 retries (~90 s)."""
    d = make_daemon(hub_endpoint=f"http://127.0.0.1:{refused_port}")
    with d.kernels() as kernels:
        took, code, detail = _timed_failure(kernels.Resolve, resolve_req(MISSING, 1), TIMEOUT)
    assert code == grpc.StatusCode.UNAVAILABLE and detail.code == E.UPSTREAM_UNAVAILABLE
    assert took < 3.0, f"a refused connection took {took:.1f}s to report"
    assert "tried 1 upstream: hub: " in detail.message, detail.message
    assert "cannot connect" in detail.message and "2 attempts" in detail.message
    assert "cannot be reached" in detail.message
    log = d.logs()
    # huggingface_hub retried nothing underneath (it logs "Retrying in 1s [Retry 1/5]").
    assert "[Retry" not in log, log


@pytest.mark.slow
def test_a_black_hole_hub_is_answered_within_the_callers_deadline(
    make_daemon: Callable[..., DaemonProcess], black_hole: BlackHole
) -> None:
    """The caller gets its answer by its deadline; the lookup goes on, bounded by the retry
    budget, and a later caller with time to wait gets its full outcome."""
    endpoint = f"http://127.0.0.1:{black_hole.port}"
    # 2 attempts of 1.5 s each: the whole lookup ends in ~3 s, well past the 1 s deadlines.
    d = make_daemon(hub_endpoint=endpoint, config={"fetch": {"timeout": 1.5, "attempts": 2}})
    with d.kernels() as kernels:
        for deadline in (1.0, 0.6):  # the second shares the lookup the first one started
            took, code, detail = _timed_failure(kernels.Resolve, resolve_req(MISSING, 1), deadline)
            assert code == grpc.StatusCode.UNAVAILABLE, (code, detail)
            assert detail.code == E.UPSTREAM_UNAVAILABLE
            assert took < deadline + SLACK_S, f"deadline {deadline}s, answered after {took:.2f}s"
            assert f"hub ({endpoint}): " in detail.message, detail.message
            assert "within the caller's deadline" in detail.message
        assert black_hole.accepted >= 1, "the daemon never asked the black hole"
        # The same bound for the other calls that may download.
        start = time.monotonic()
        many = kernels.ResolveMany(
            pb.ResolveManyRequest(requests=[resolve_req(MISSING, 1), resolve_req(MISSING, 2)]),
            timeout=1.0,
        )
        assert time.monotonic() - start < 1.0 + SLACK_S
        assert [r.error.code for r in many.results] == [E.UPSTREAM_UNAVAILABLE] * 2, many
        assert all(f"hub ({endpoint}): " in r.error.message for r in many.results)
        listing = pb.ListVariantsRequest(
            kernel=resolve_req(MISSING, 1).kernel, platform=CPU, allow_fetch=True
        )
        took, code, detail = _timed_failure(kernels.ListVariants, listing, 1.0)
        assert code == grpc.StatusCode.UNAVAILABLE and took < 1.0 + SLACK_S, (code, took)
        assert f"hub ({endpoint}): " in detail.message, detail.message

        # A caller that can wait gets the lookup's own end: bounded by attempts x timeout.
        time.sleep(4.0)  # the lookups started above have ended by now
        took, code, detail = _timed_failure(kernels.Resolve, resolve_req(MISSING, 1), TIMEOUT)
        assert code == grpc.StatusCode.UNAVAILABLE and detail.code == E.UPSTREAM_UNAVAILABLE
        assert took < 2 * 1.5 + 0.2 + 2 * SLACK_S, f"the retry loop took {took:.1f}s"
        assert "tried 1 upstream: hub: " in detail.message, detail.message
        assert "no answer in time" in detail.message and "2 attempts" in detail.message
        # The daemon still answers other calls at once while lookups hang.
        status = kernels.GetStatus(pb.GetStatusRequest(), timeout=2.0)
        assert [u.name for u in status.upstreams] == ["hub"]
    started = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - started < 10.0


def test_huggingface_hub_retries_nothing_under_kerneld(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer
) -> None:
    """Tree listings go through huggingface_hub's `http_backoff` (5 retries, 1+2+4+8+8 s of
    sleep on a 503): with kerneld's 2 attempts the Hub sees exactly 2 listing requests, and the
    caller its answer in about a second, not 2 x 23 s."""
    hub_server.inject(Fault("*/tree/*", "error", status=503))
    d = make_daemon(hub_endpoint=hub_server.url, config={"fetch": {"attempts": 2}})
    with d.kernels() as kernels:
        took, code, detail = _timed_failure(kernels.Resolve, resolve_req(REPO, 1), TIMEOUT)
    assert code == grpc.StatusCode.UNAVAILABLE and detail.code == E.UPSTREAM_UNAVAILABLE
    assert hub_server.counts["tree"] == 2, hub_server.requests
    assert took < 3.0, f"took {took:.1f}s"
    assert "tried 1 upstream: hub: list variants failed after 2 attempts" in detail.message
    assert "HTTP 503" in detail.message, detail.message


def test_the_reason_names_every_upstream_and_its_answer(
    make_daemon: Callable[..., DaemonProcess], refused_port: int, kernel_mirror: Path
) -> None:
    """A refused Hub and a mirror without the kernel: the answer says both, not just one."""
    d = make_daemon(hub_endpoint=f"http://127.0.0.1:{refused_port}", mirror_dirs=[kernel_mirror])
    with d.kernels() as kernels:
        names = [
            u.name for u in kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT).upstreams
        ]
        _, code, detail = _timed_failure(kernels.Resolve, resolve_req(MISSING, 1), TIMEOUT)
    assert len(names) == 2, names
    # One upstream down and one without the kernel: "unavailable", as it may be the Hub's.
    assert code == grpc.StatusCode.UNAVAILABLE and detail.code == E.UPSTREAM_UNAVAILABLE
    assert "tried 2 upstreams: " in detail.message, detail.message
    for name in names:
        assert f"{name}: " in detail.message, (name, detail.message)
    assert "cannot connect" in detail.message


def test_huggingface_hub_lines_reach_the_log_once() -> None:
    """huggingface_hub adds its own stderr handler and also propagates to the root logger:
    under kerneld's handler each of its lines was printed twice. Both import orders."""
    emit = (
        "import logging\n"
        "logging.getLogger('huggingface_hub.probe').warning('probe-line')\n"
        "logging.getLogger('huggingface_hub').warning('probe-root')\n"
    )
    orders = {
        "setup first": "from kerneld.server.plumbing import logs\nlogs.setup('info')\n"
        "import kerneld.upstream.hub\n",
        "hub first": "import huggingface_hub\nfrom kerneld.server.plumbing import logs\n"
        "logs.setup('info')\n",
    }
    for order, prelude in orders.items():
        proc = subprocess.run(
            [sys.executable, "-c", prelude + emit],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        lines = proc.stderr.splitlines()
        for needle in ("probe-line", "probe-root"):
            hits = [line for line in lines if needle in line]
            assert len(hits) == 1, (order, proc.stderr)
            assert "WARNING huggingface_hub" in hits[0], hits


def test_the_retry_loop_keeps_to_its_time_budget_and_gives_up_on_unreachable_hosts() -> None:
    """kerneld's own loop: no attempt starts past the budget, each request's timeout is cut to
    what is left of it, and a host that cannot be reached is tried twice, not `attempts` times."""
    policy = RetryPolicy(attempts=20, base_delay=0.1, max_delay=0.1, timeout=5.0, budget=0.6)
    timeouts: list[float] = []

    def slow_failure() -> None:
        timeouts.append(request_timeout(99.0))
        time.sleep(0.1)
        raise TransientError("HTTP 503")

    start = time.monotonic()
    with pytest.raises(UpstreamUnavailable, match="budget") as info:
        with_retries(slow_failure, policy=policy, what="probe", upstream="probe-up")
    took = time.monotonic() - start
    assert took < 0.6 + 0.3, took
    assert 2 <= len(timeouts) < 20, timeouts
    assert timeouts[0] <= 0.6 and all(b < a for a, b in itertools.pairwise(timeouts))
    assert request_timeout(7.0) == 7.0  # outside a call: the caller's own
    assert recent_failure("probe-up", start) == "HTTP 503"
    assert "HTTP 503" in str(info.value)

    calls = 0

    def refused() -> None:
        nonlocal calls
        calls += 1
        raise TransientError("connection refused", unreachable=True)

    with pytest.raises(UpstreamUnavailable, match="cannot be reached"):
        with_retries(refused, policy=RetryPolicy(attempts=4, base_delay=0.01), what="probe")
    assert calls == 2
