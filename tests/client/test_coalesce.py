"""Cold resolves coalesce between the processes of one user on a host (`_coalesce`): ranks that
start together ask the daemon once; the others wait for that answer and read the index."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneld_client import _coalesce
from kerneld_client._types import KernelRequest
from tests.client.support import ACTIVATION, OPS_CHECK, ROOT, client_env
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

RANK = (
    OPS_CHECK
    + """
import json, os, sys, time
from pathlib import Path
import kerneld_client
get_kernel = kerneld_client.get_kernel  # import the loader before the start line
go = Path(os.environ["GO_FILE"])
Path(f"{go}.ready.{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.005)
mod = get_kernel(REPO, version=1, policy="error")
staged = "kerneld_client.loader" in sys.modules  # before loaded_kernels(), which imports it
check_activation(mod, 1)
print(json.dumps({"source": kerneld_client.loaded_kernels()[0].source,
                  "grpc": "grpc" in sys.modules,
                  "staged": staged}))
"""
)


def _ranks(n: int, env: dict[str, str], go: Path) -> list[dict[str, object]]:
    """Start `n` client processes, release them together, return their reports."""
    code = textwrap.dedent(RANK).replace("REPO", repr(ACTIVATION))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**env, "GO_FILE": str(go)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    out = []
    try:
        deadline = time.monotonic() + 90  # every rank has imported torch and the loader
        while len(list(go.parent.glob(f"{go.name}.ready.*"))) < n:
            assert time.monotonic() < deadline, "ranks did not get ready"
            assert all(p.poll() is None for p in procs), "a rank exited early"
            time.sleep(0.05)
        go.touch()
        for p in procs:
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, stderr
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


@pytest.fixture
def slow_hub_daemon(
    make_daemon: Callable[..., DaemonProcess], example_server: HubServer
) -> DaemonProcess:
    example_server.reset()
    example_server.latency_s = 0.2  # each Hub request: the leader's fetch takes a while
    return make_daemon(hub_endpoint=example_server.url)


def test_ranks_starting_together_ask_the_daemon_once(
    slow_hub_daemon: DaemonProcess, example_server: HubServer, tmp_path: Path
) -> None:
    env = client_env(None, tmp_path, KERNELD_SOCKET=str(slow_hub_daemon.user_socket))
    reports = _ranks(3, env, tmp_path / "go")
    sources = sorted(str(r["source"]) for r in reports)
    assert sources.count("daemon") == 1, reports
    # The others never imported grpc, nor the staged loader (issue 56: at N = 64 on 2 cores
    # those imports were most of a cold start's cost over a warm one): they waited in the warm
    # path and read the published index.
    waiters = [r for r in reports if r["source"] != "daemon"]
    assert all(r["source"] == "index" and not r["grpc"] for r in waiters), reports
    assert not any(r["staged"] for r in waiters), reports
    assert example_server.counts["resolve_get"] > 0  # the one fetch really happened


def test_coalescing_can_be_turned_off(
    slow_hub_daemon: DaemonProcess, example_server: HubServer, tmp_path: Path
) -> None:
    env = client_env(
        None, tmp_path, KERNELD_SOCKET=str(slow_hub_daemon.user_socket), KERNELD_COALESCE="0"
    )
    reports = _ranks(2, env, tmp_path / "go")
    assert [r["source"] for r in reports] == ["daemon"] * 2, reports


def test_turn_waits_for_the_holder_then_lets_the_index_answer(tmp_path: Path) -> None:
    req = KernelRequest("org/k", version=1)
    sock = tmp_path / "kerneld.sock"
    with _coalesce.turn(sock, req, 5.0) as first:
        assert first  # nobody else: this process asks
        started = time.monotonic()
        with _coalesce.turn(sock, req, 0.3) as second:
            # flock is per open file: the second open in this process waits like another
            # process would, until its deadline (the first still holds the lock).
            assert not second
        assert time.monotonic() - started >= 0.3
    with _coalesce.turn(sock, req, 5.0) as again:
        assert again  # released with the first
    with (
        _coalesce.turn(sock, KernelRequest("org/k", version=2), 0.1) as other,
        _coalesce.turn(sock, req, 0.1) as same,
    ):
        assert other and same  # another request (version 2) has its own lock


def test_an_unsafe_lock_directory_turns_coalescing_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert _coalesce._lock_dir() is not None
    folder = tmp_path / f"kerneld-{os.geteuid()}"
    folder.chmod(0o777)  # another user could swap the lock files
    assert _coalesce._lock_dir() is None
    # The user's runtime directory, when there is one, takes over.
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert _coalesce._lock_dir() == runtime / "kerneld" / "resolving"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    req = KernelRequest("org/k", version=1)
    with (
        _coalesce.turn(tmp_path / "s", req, 0.1) as a,
        _coalesce.turn(tmp_path / "s", req, 0.1) as b,
    ):
        assert a and b  # without safe locks every process asks


def test_a_dead_holder_frees_the_turn(tmp_path: Path) -> None:
    req = KernelRequest("org/k", version=1)
    sock = tmp_path / "kerneld.sock"
    key = _coalesce._key(sock, req)
    folder = _coalesce._lock_dir()
    assert folder is not None
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(folder / (key + '.lock'))!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        fd = os.open(folder / f"{key}.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
        started = time.monotonic()
        threading.Timer(0.3, holder.kill).start()  # dies while this process waits
        with _coalesce.turn(sock, req, 30.0) as ask:
            assert not ask  # it waited for the holder, which died: the lock is free
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()


def _other_thread_turn(sock: Path, req: KernelRequest, deadline_s: float) -> bool:
    seen: list[bool] = []

    def run() -> None:
        with _coalesce.turn(sock, req, deadline_s) as ask:
            seen.append(ask)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_the_warm_paths_turn_is_handed_to_the_staged_loaders_and_ends_with_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm path's miss takes the turn (so waiters never import the staged loader); the
    staged loader's turn in the same thread is that one, and the lock goes when the daemon has
    answered, not when the whole load (a fallback, say) is over."""
    sock = tmp_path / "kerneld.sock"
    sock.touch()  # a socket path that exists (nothing here connects to it)
    monkeypatch.setenv("KERNELD_SOCKET", str(sock))
    req = KernelRequest("org/k", version=1)
    with _coalesce.warm_turn("org/k", 1, None) as first:
        assert first  # nobody else: this thread asks
        assert not _other_thread_turn(sock, req, 0.2)  # another thread waits, as a process would
        with _coalesce.turn(sock, req, 5.0) as staged:
            assert staged  # handed over: no second lock, no wait
            assert not _other_thread_turn(sock, req, 0.1)
        assert _other_thread_turn(sock, req, 0.1)  # released with the daemon's answer
    with _coalesce.warm_turn("org/k", 1, None) as again:
        assert again
    assert _other_thread_turn(sock, req, 0.1)  # a warm turn the staged loader never used ends
    with _coalesce.warm_turn("org/k", None, None) as invalid:
        assert invalid  # a request it cannot name: the staged loader says what is wrong
