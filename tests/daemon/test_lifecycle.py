"""Start, readiness, sd_notify/watchdog, signals, single instance, config errors, journald logs."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from kerneld.config import load_config
from kerneld_client.locations import advert_path
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT, failure, resolve_req
from tests.fixtures_daemon import ACT, C1, MULTI
from tests.support.daemon import REPO_ROOT, DaemonFailed, DaemonProcess, clean_env

E = pb.ErrorCode
SERVING = health_pb2.HealthCheckResponse.SERVING


class NotifyListener:
    """A stand-in for systemd's NOTIFY_SOCKET: collects the datagrams the daemon sends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        path.chmod(0o777)  # as systemd's /run/systemd/notify: the daemon is not root
        self.sock.settimeout(0.1)
        self.messages: list[dict[str, str]] = []

    def collect(self, until: Callable[[list[dict[str, str]]], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not until(self.messages):
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(fields)
        assert until(self.messages), f"notifications so far: {self.messages}"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyListener]:
    sock_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    listener = NotifyListener(sock_dir / f"kd-notify-{os.getpid()}-{time.monotonic_ns()}.sock")
    yield listener
    listener.close()
    listener.path.unlink(missing_ok=True)


def test_readiness_watchdog_sigterm_and_journald_lines(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, notify: NotifyListener
) -> None:
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        env={
            "NOTIFY_SOCKET": str(notify.path),
            "WATCHDOG_USEC": "200000",
            "JOURNAL_STREAM": "8:12345",
        },
        start=False,
    )
    d.spawn()
    notify.collect(lambda ms: any(m.get("READY") == "1" for m in ms))
    ready = next(m for m in notify.messages if m.get("READY") == "1")
    # READY=1 comes only once the store is open: health already answers SERVING, the advert
    # is there.
    assert d.health() == SERVING
    assert advert_path(d.user_socket).exists()
    assert "serving" in ready["STATUS"] and ready["MAINPID"] == str(d.pid)
    before = [m["STATUS"] for m in notify.messages[: notify.messages.index(ready)] if "STATUS" in m]
    assert any("opening store" in s for s in before)
    # Watchdog pings every WATCHDOG_USEC/2 = 0.1 s.
    start = len(notify.messages)
    notify.collect(lambda ms: sum(m.get("WATCHDOG") == "1" for m in ms[start:]) >= 3, timeout=3)
    with d.kernels() as kernels:
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)

    d.send_signal(signal.SIGTERM)
    notify.collect(lambda ms: any(m.get("STOPPING") == "1" for m in ms))
    assert d.wait() == 0
    assert not d.user_socket.exists() and not d.admin_socket.exists()
    assert not advert_path(d.user_socket).exists()

    # Under systemd (JOURNAL_STREAM): one line per event, a priority prefix, no timestamp.
    lines = [line for line in d.logs().splitlines() if line.strip()]
    assert lines and all(re.match(r"^<[0-7]>kerneld[.\w]*: ", line) for line in lines), lines
    fetched = [line for line in lines if "resolve repo=" in line and "miss (fetched)" in line]
    assert len(fetched) == 1 and fetched[0].startswith("<6>")
    assert f"repo={ACT}" in fetched[0] and "variant=torch213-cxx11-cpu-x86_64-linux" in fetched[0]
    text = "\n".join(lines)
    assert "draining" in text and "stopped (SIGTERM)" in text and "closed store" in text


def test_a_second_daemon_never_takes_over_sockets_or_store(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    first = make_daemon("first", mirror_dirs=[kernel_mirror])
    # Same socket paths, another store: refused by the socket lock.
    same_socket = make_daemon(
        "same-socket", mirror_dirs=[kernel_mirror], socket_dir=first.socket_dir, start=False
    )
    # Other sockets, same store: refused by the store's owner lock.
    same_store = make_daemon(
        "same-store", mirror_dirs=[kernel_mirror], store=first.store_root, start=False
    )
    same_socket.spawn()
    same_store.spawn()
    assert same_socket.wait(timeout=15) == 3
    assert f"another kerneld (pid {first.pid}) is serving {first.user_socket}" in same_socket.logs()
    assert same_store.wait(timeout=15) == 3
    assert f"owned by pid {first.pid}" in same_store.logs()
    assert not same_store.user_socket.exists() and not same_store.admin_socket.exists()
    # The first daemon still owns its sockets and serves.
    assert first.health() == SERVING
    with first.kernels() as kernels:
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.commit == C1


def test_a_live_foreign_socket_is_not_taken_over(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], start=False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(d.user_socket))
        other.listen()
        d.spawn()
        assert d.wait(timeout=15) == 3
    assert "in use by a live server" in d.logs()


def test_a_stale_socket_left_by_a_crash_is_replaced(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror])
    d.stop(signal.SIGKILL)
    assert d.user_socket.exists()  # a crash leaves the socket file behind
    d.start()
    assert "removing stale socket" in d.logs()
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.commit == C1


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[resolve]\nref_ttl = 'soon'\n", "resolve.ref_ttl"),
        ("[sockets]\nadmin_group = 'no-such-group-kd'\n", ""),
    ],
)
def test_invalid_config_fails_at_start(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, text: str, key: str
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], start=False)
    d.config_path.write_text(text)
    d.spawn()
    assert d.wait(timeout=15) == 2
    if key:
        assert f"invalid configuration: {d.config_path}: {key}: " in d.logs()
    else:
        assert "group 'no-such-group-kd' does not exist" in d.logs()
    assert not d.user_socket.exists()


def test_check_config_prints_the_resolved_config(tmp_path: Path) -> None:
    config = tmp_path / "kerneld.toml"
    config.write_text("[fetch]\nattempts = 3\n[prefetch]\nkernels = ['org/a:1']\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kerneld.server.main",
            "--check-config",
            "--config",
            str(config),
            "--store",
            str(tmp_path / "s"),
            "--upstream-mirror-dir",
            str(tmp_path / "m"),
        ],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    dumped = tmp_path / "dumped.toml"
    dumped.write_text(result.stdout)
    cfg = load_config(dumped, env={})
    assert cfg.fetch_attempts == 3 and cfg.store_path == tmp_path / "s"
    assert [u.kind for u in cfg.upstreams] == ["mirror-dir", "hub"]
    assert cfg.prefetch[0].version == 1
    assert "# hardware: cpu=" in result.stdout

    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "kerneld.server.main",
            "--check-config",
            "--metrics-listen",
            "0.0.0.0:80",
            "--config",
            str(config),
        ],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--metrics-listen" in bad.stderr


def test_sighup_reloads_the_config(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror])
    d.write_config({"fetch": {"allow": ["nobody/*"]}, "log": {"level": "info"}})
    d.send_signal(signal.SIGHUP)
    d.wait_for_log("config reloaded")
    with d.kernels() as kernels:
        code, detail = failure(kernels.Resolve, resolve_req(MULTI, 1))
        assert (code, detail.code) == (grpc.StatusCode.PERMISSION_DENIED, E.FETCH_NOT_ALLOWED)
        # An invalid file on SIGHUP is reported; the daemon keeps running on the old config.
        d.config_path.write_text("[log]\nlevel = 'loud'\n")
        d.send_signal(signal.SIGHUP)
        d.wait_for_log("reload failed, keeping the running config")
        assert d.running() and d.health() == SERVING
        code, _ = failure(kernels.Resolve, resolve_req(MULTI, 1))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        d.write_config({"fetch": {"allow": ["kerneld-test/*"]}})
        d.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                kernel = kernels.Resolve(resolve_req(MULTI, 1), timeout=TIMEOUT).kernel
                break
            except grpc.RpcError:
                time.sleep(0.05)
        else:
            raise AssertionError(d.logs())
        assert kernel.fetched


def test_not_ready_daemon_answers_unavailable(tmp_path: Path) -> None:
    """A daemon that cannot open its store never reports SERVING and exits non-zero."""
    store = tmp_path / "store"
    store.write_text("not a directory")
    d = DaemonProcess(tmp_path / "d", store=store, mirror_dirs=[tmp_path])
    with pytest.raises(DaemonFailed, match="exited with 1"):
        d.start()
    d.close()
