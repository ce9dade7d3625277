"""No user of the user socket can take the daemon away from the others (issue 20, 1.4).

The attacker is `nobody` (the user socket is opened to everyone here; in production it is any
member of kerneld-users) against a real daemon running as the unprivileged `kerneld` user, with
low configured caps so a few hundred connections are a flood:

- connections held open are capped per socket, and the cap leaves descriptors under the
  open-files limit: with a limit a flood *without* the cap fills, the admin socket answers, a
  victim's cached kernel loads from the index and its cold load fails fast;
- calls that hold RPC threads (downloads from a Hub that never answers) are capped too: the
  next call is answered RESOURCE_EXHAUSTED at once instead of queueing past its deadline, and
  the admin socket, with its own threads, answers throughout;
- one ResolveMany is bounded in entries.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kerneld.server.app import FD_RESERVE
from kerneld.server.fronts.httpfront.httphead import HttpLimits
from kerneld.server.fronts.metrics_endpoint import METRICS_LIMITS
from kerneld.server.plumbing.identity import TokenBook
from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, resolve_req
from tests.daemon.test_bounded_wait import BlackHole
from tests.fixtures_daemon import ACT, DEP_BOTTOM
from tests.security.support import CPU_FACTS, NOBODY, needs_root
from tests.support.daemon import REPO_ROOT, DaemonFailed, DaemonProcess, clean_env

OPEN_TO_ALL = {"sockets": {"user_mode": "0666"}}
#: What a loaded 2-core machine may take to answer a call that is not waiting for anything.
PROMPT_S = 1.5


def _attacker(socket: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.security.flood_rpc",
        str(NOBODY.pw_uid),
        str(NOBODY.pw_gid),
        str(socket),
        *args,
    ]


def _env() -> dict[str, str]:
    return clean_env({"PYTHONPATH": f"{REPO_ROOT / 'client'}:{REPO_ROOT}"})


def _run_attacker(socket: Path, *args: str, timeout: float = 60) -> dict[str, Any]:
    done = subprocess.run(
        _attacker(socket, *args),
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@contextmanager
def open_files_limit(soft: int) -> Iterator[None]:
    """Lower this process's soft open-files limit while a daemon is spawned (it inherits it)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _limits(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files limit")


def _admin_answers(d: DaemonProcess) -> float:
    """Seconds the admin socket took to answer health and GetAdminStatus."""
    started = time.monotonic()
    with grpc.insecure_channel(f"unix:{d.admin_socket}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=PROMPT_S * 2
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with d.admin() as admin:
        assert admin.GetAdminStatus(pb.GetStatusRequest(), timeout=PROMPT_S * 2).status.ready
    return time.monotonic() - started


VICTIM_LOADS = """
import json, time, torch, kerneld_client
out = {}
out["warm"] = kerneld_client.get_kernel(%(warm)r, version=1, policy="error").NAME
out["source"] = kerneld_client.loaded_kernels()[0].source
started = time.monotonic()
try:
    kerneld_client.get_kernel(%(cold)r, version=1, policy="error")
    out["cold"] = "loaded"
except kerneld_client.KernelError as exc:
    out["cold"] = type(exc).__name__
    out["message"] = str(exc)
out["cold_s"] = time.monotonic() - started
print(json.dumps(out))
"""


@needs_root
def test_a_connection_flood_is_capped_and_the_admin_socket_still_answers(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    cap, admin_cap, flood = 40, 16, 800
    # A limit 800 connections would fill: without a cap the daemon could not accept anything
    # (admin socket included) once the flood is in.
    limit = cap + admin_cap + TokenBook.MAX_BOUND + FD_RESERVE + 100
    with open_files_limit(limit):
        d = make_daemon(
            mirror_dirs=[kernel_mirror],
            config={
                **OPEN_TO_ALL,
                "server": {"max_connections": cap, "admin_max_connections": admin_cap},
            },
        )
    assert d.proc is not None and _limits(d.proc.pid) == limit
    with d.kernels() as kernels:  # the victim's kernel is cached before the attack
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)

    attacker = subprocess.Popen(
        _attacker(d.user_socket, "hold", str(flood)),
        cwd=REPO_ROOT,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None
        held = json.loads(attacker.stdout.readline() or "{}")
        assert held, attacker.stderr.read() if attacker.stderr else ""
        # The daemon accepted the flood and closed all but `cap` of it.
        assert held["connected"] == flood, held
        assert cap // 2 <= held["open"] <= cap, held

        assert _admin_answers(d) < PROMPT_S
        env = client_env(
            d.store_root,
            tmp_path,
            KERNELD_SOCKET=str(d.user_socket),
            KERNELD_PLATFORM_JSON=CPU_FACTS,
        )
        victim = run_client(VICTIM_LOADS % {"warm": ACT, "cold": DEP_BOTTOM}, env)
        # What is cached loads from the index, without the daemon...
        assert victim["source"] == "index", victim
        # ...and what needs the daemon fails fast, as "daemon unavailable" (the job falls back).
        assert victim["cold"] == "DaemonUnavailable", victim
        assert "is unavailable" in victim["message"], victim
        assert victim["cold_s"] < PROMPT_S, victim
        assert d.health() is None  # the user socket is full: the cap holds for everyone
    finally:
        if attacker.stdin is not None:
            attacker.stdin.close()
        attacker.wait(timeout=30)
    # The flood gone, the user socket serves again.
    deadline = time.monotonic() + 10
    while d.health() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(DEP_BOTTOM, 1), timeout=TIMEOUT).kernel.path
    assert "Too many open files" not in d.logs()


@needs_root
def test_a_flood_of_slow_resolves_is_answered_at_once_and_spares_the_admin_socket(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    """24 callers asking for random kernels from a Hub that never answers hold every RPC thread
    until their deadline; the 5th call at once gets RESOURCE_EXHAUSTED, not a place in a queue
    behind them (where a 1 s client call would time out and mark the daemon down)."""
    hole = BlackHole()
    try:
        d = make_daemon(
            mirror_dirs=[kernel_mirror],
            hub_endpoint=f"http://127.0.0.1:{hole.port}",
            config={
                **OPEN_TO_ALL,
                "server": {"threads": 4, "max_concurrent_rpcs": 4},  # no queue
                "fetch": {"timeout": "5s", "attempts": 1},
            },
        )
        with d.kernels() as kernels:
            kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
        attacker = subprocess.Popen(
            _attacker(d.user_socket, "resolve", "24", "4", "4"),
            cwd=REPO_ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(2.0)  # the attacker is in and holds every RPC thread
            victim_codes = []
            with d.kernels() as kernels:
                for _ in range(3):
                    started = time.monotonic()
                    try:
                        kernels.Resolve(resolve_req(ACT, 1, allow_fetch=False), timeout=1.0)
                        victim_codes.append("OK")
                    except grpc.RpcError as exc:
                        victim_codes.append(exc.code().name)
                        assert "limit" in (exc.details() or ""), exc
                    assert time.monotonic() - started < PROMPT_S / 2, victim_codes
            assert "RESOURCE_EXHAUSTED" in victim_codes, victim_codes
            assert _admin_answers(d) < PROMPT_S
        finally:
            out, err = attacker.communicate(timeout=60)
        assert attacker.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["codes"].get("RESOURCE_EXHAUSTED", 0) > 0, result
        assert result["slowest_rejection"] < PROMPT_S, result
        assert hole.accepted >= 1  # the attacker's calls did reach the (silent) Hub
    finally:
        hole.close()


@needs_root
def test_resolve_many_is_bounded_in_entries(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(
        mirror_dirs=[kernel_mirror], config={**OPEN_TO_ALL, "server": {"max_resolve_many": 8}}
    )
    over = _run_attacker(d.user_socket, "many", "20000", ACT)
    assert over["code"] == "INVALID_ARGUMENT", over
    assert "20000" in over["message"] and "max_resolve_many" in over["message"], over
    assert "at most 8" in over["message"], over
    with d.admin() as admin:  # the refused call took no lease
        assert admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT).active_leases == 0
        # At the limit the call is served, a lease per entry.
        assert _run_attacker(d.user_socket, "many", "8", ACT) == {"code": "OK", "results": 8}
        assert admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT).active_leases == 8


def test_the_connection_caps_must_fit_under_the_open_files_limit(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    """A cap the descriptor limit cannot hold is refused at start, naming the key and LimitNOFILE
    (else the user socket could again take the descriptors the admin socket needs)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cap = min(hard, 1 << 20)  # the highest max_connections the config takes
    need = cap + 64 + TokenBook.MAX_BOUND + FD_RESERVE  # no Hub API, no metrics listener
    if hard == resource.RLIM_INFINITY or need <= hard:
        pytest.skip("the open-files limit is too high to exceed")
    d = make_daemon(
        start=False, mirror_dirs=[kernel_mirror], config={"server": {"max_connections": cap}}
    )
    with pytest.raises(DaemonFailed) as failed:
        d.start()
    assert d.returncode == 2
    message = str(failed.value)
    assert "server.max_connections" in message and "LimitNOFILE" in message, message
    assert str(need) in message, message


class LimitedDaemon(DaemonProcess):
    """A daemon started under `prlimit --nofile=N:N` (a hard limit it cannot raise; lowering
    this process's own would be for good: root here may lack CAP_SYS_RESOURCE)."""

    def __init__(self, *args: Any, nofile: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.nofile = nofile

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *super().command()]


@needs_root
def test_every_listener_and_the_token_book_are_in_the_descriptor_budget(
    kernel_mirror: Path, tmp_path: Path
) -> None:
    """The daemon starts only if every part that holds descriptors for callers fits under the
    open-files limit beside the store's reserve: both gRPC sockets' caps, the pidfds binding
    callers' tokens, the Hub endpoint's and the metrics listener's connections (a refused HTTP
    connection is held a moment too). A part left out could be filled by one member until the
    store had no descriptor left."""
    cap, admin_cap = 40, 16
    hub, metrics = HttpLimits(), METRICS_LIMITS
    need = (
        cap
        + admin_cap
        + TokenBook.MAX_BOUND
        + hub.max_connections
        + hub.max_refused_draining
        + metrics.max_connections
        + metrics.max_refused_draining
        + 1  # the sock_diag netlink socket that names TCP peers (issue 52)
        + FD_RESERVE
    )
    config = {
        "server": {"max_connections": cap, "admin_max_connections": admin_cap},
        "hub_api": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
    }
    short = LimitedDaemon(tmp_path / "short", nofile=need - 1, mirror_dirs=[kernel_mirror],
                          config=config)  # fmt: skip
    try:
        with pytest.raises(DaemonFailed) as failed:
            short.start()
        assert short.returncode == 2
    finally:
        short.close()
    message = str(failed.value)
    for part in (
        "caller pidfds",
        "Hub API connections",
        "metrics connections",
        "sock_diag",
        str(need),
    ):
        assert part in message, message
    with LimitedDaemon(
        tmp_path / "fits", nofile=need, mirror_dirs=[kernel_mirror], config=config
    ) as d:
        assert d.proc is not None and _limits(d.proc.pid) == need
