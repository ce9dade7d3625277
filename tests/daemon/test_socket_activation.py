"""The daemon on sockets passed the way systemd passes them (kerneld.socket, socket activation).

The test plays PID 1: it creates and holds the Hub API's listening sockets (loopback TCP and a
unix socket), and starts the real daemon with them as descriptors 3 and 4, `LISTEN_FDS`,
`LISTEN_FDNAMES` and `LISTEN_PID` set to the daemon's own pid (a bash wrapper moves the
descriptors and exports `$$` before it execs the daemon, as systemd does between fork and exec).
Checked: the daemon serves what it is passed (identity at accept included: `nobody` is refused
with the daemon's answer, root is served), leaves the sockets as it got them, and a restart
while clients connect refuses none of them, where a daemon that binds its own port refuses some
(the control). tests/systemd/test_install.py does the same under a real systemd.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.server.plumbing.activation import HUB_API
from tests.security.support import NOBODY, as_user
from tests.support.daemon import DaemonProcess, clean_env

pytestmark = pytest.mark.timeout(120)
REQUEST = b"GET /api/kernels/kerneld-test/act/refs HTTP/1.0\r\n\r\n"


def high(fd: int) -> int:
    """A duplicate of `fd` numbered above the ones it will be moved to (3, 4, ...)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 20)


def wrapper(fds: list[int], names: list[str], argv: list[str]) -> list[str]:
    """bash moves `fds` to 3, 4, ..., exports the LISTEN_* variables with its own pid (exec
    keeps it) and execs `argv`: what systemd does in the child it forks for the service."""
    moves = " ".join(f"{3 + i}<&{fd} {fd}<&-" for i, fd in enumerate(fds))
    script = (
        f"exec {moves}; export LISTEN_PID=$$ LISTEN_FDS={len(fds)} "
        f'LISTEN_FDNAMES={":".join(names)}; exec "$@"'
    )
    return ["bash", "-c", script, "bash", *argv]


class ActivatedDaemon(DaemonProcess):
    """A DaemonProcess started with `passed` sockets, as systemd starts kerneld.service."""

    def __init__(self, *args: object, passed: list[tuple[str, socket.socket]], **kw: object):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.fds = [high(sock.fileno()) for _, sock in passed]
        self.names = [name for name, _ in passed]
        self.pass_fds = tuple(self.fds)

    def command(self) -> list[str]:
        return wrapper(self.fds, self.names, super().command())

    def close(self) -> None:
        super().close()
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[socket.socket, socket.socket, Path]]:
    """What kerneld.socket makes: 127.0.0.1:<free port> and a unix socket, mode 0660."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(socket.SOMAXCONN)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    path = folder / "hub-api.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(path))
    os.chmod(path, 0o660)
    unix.listen(socket.SOMAXCONN)
    yield tcp, unix, path
    tcp.close()
    unix.close()


def ask(port: int, timeout: float = 30.0) -> str:
    """One request on a new connection: "refused", or the answer's status line."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(REQUEST)
            return s.makefile("rb").readline().decode(errors="replace").strip() or "closed"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"error {exc}"


def ask_during_restart(d: DaemonProcess, port: int) -> tuple[Counter[str], int]:
    """Requests every 10 ms from before `d` stops until after it is ready again; what they got,
    and how many were made while no daemon was serving."""
    got: Counter[str] = Counter()
    gap = [0.0, 0.0]
    times: list[float] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            t = time.monotonic()
            answer = ask(port)
            got["refused" if answer == "refused" else answer.split(" ", 2)[1] if " " in answer
                else answer] += 1  # fmt: skip
            times.append(t)
            time.sleep(0.01)

    workers = [threading.Thread(target=client) for _ in range(4)]
    for w in workers:
        w.start()
    time.sleep(0.3)
    gap[0] = time.monotonic()
    d.stop()
    d.start()
    gap[1] = time.monotonic()
    time.sleep(0.3)
    stop.set()
    for w in workers:
        w.join(40)
    return got, sum(1 for t in times if gap[0] <= t <= gap[1])


def test_the_daemon_serves_passed_sockets_and_a_restart_refuses_nobody(
    tmp_path: Path, held: tuple[socket.socket, socket.socket, Path], kernel_mirror: Path
) -> None:
    tcp, unix, path = held
    port = tcp.getsockname()[1]
    mode_before = os.stat(path)
    d = ActivatedDaemon(
        tmp_path / "d", passed=[(HUB_API, tcp), (HUB_API, unix)], mirror_dirs=[kernel_mirror]
    )
    with d:
        logs = d.wait_for_log(f"hub api on http://127.0.0.1:{port}")
        assert "socket activation: hub-api=127.0.0.1:" in logs, logs
        assert f"hub api on unix:{path}" in logs, logs
        # served, and identity at accept works on a socket the daemon did not create
        assert ask(port).startswith("HTTP/1."), ask(port)
        refused = as_user(NOBODY.pw_uid, NOBODY.pw_gid, lambda: ask(port))
        assert " 403 " in refused, refused
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(20)
            s.connect(str(path))
            s.sendall(REQUEST)
            assert s.recv(64).startswith(b"HTTP/1."), "no answer on the passed unix socket"

        got, during = ask_during_restart(d, port)
        assert got["refused"] == 0 and set(got) <= {"200", "404"}, got
        assert during >= 4, f"only {during} requests fell into the restart: it tested nothing"
        # the daemon leaves systemd's socket as it got it: path, mode, owner
        after = os.stat(path)
        assert stat.S_ISSOCK(after.st_mode)
        assert (after.st_mode, after.st_uid, after.st_gid) == (
            mode_before.st_mode,
            mode_before.st_uid,
            mode_before.st_gid,
        )
    assert path.is_socket(), "stopping the daemon removed the socket systemd holds"


def test_a_daemon_that_binds_its_own_port_refuses_during_a_restart(
    tmp_path: Path, kernel_mirror: Path
) -> None:
    """The control: without a passed socket the same restart refuses connections (so the test
    above can fail, and this is what kerneld.socket removes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = {"hub_api": {"listen": f"127.0.0.1:{port}"}}
    with DaemonProcess(tmp_path / "d", config=config, mirror_dirs=[kernel_mirror]) as d:
        d.wait_for_log(f"hub api on http://127.0.0.1:{port}")
        got, during = ask_during_restart(d, port)
    assert got["refused"] > 0, (got, during)


def test_a_config_that_names_another_address_stops_the_daemon(
    tmp_path: Path, held: tuple[socket.socket, socket.socket, Path], kernel_mirror: Path
) -> None:
    tcp, _, _ = held
    d = ActivatedDaemon(
        tmp_path / "d",
        passed=[(HUB_API, tcp)],
        config={"hub_api": {"listen": "127.0.0.1:1"}},
        mirror_dirs=[kernel_mirror],
    )
    try:
        d.spawn()
        assert d.wait(30) == 2  # EXIT_CONFIG
        logs = d.logs()
    finally:
        d.close()
    assert "[hub_api] listen = '127.0.0.1:1' but systemd passed the Hub API 127.0.0.1:" in logs
    assert "make them agree" in logs, logs


def read_passed(
    fds: list[int], names: list[str], *, pid: str = "$$"
) -> subprocess.CompletedProcess[str]:
    """`listen_fds()` in a fresh python, given `fds` as systemd would give them."""
    code = (
        "import os, sys\n"
        "from kerneld.server.plumbing.activation import listen_fds, ActivationError\n"
        "try:\n"
        "    got = listen_fds()\n"
        "except ActivationError as exc:\n"
        "    print('error:', exc); sys.exit(3)\n"
        "print([(i.name, i.describe()) for i in got])\n"
        "print(sorted(k for k in os.environ if k.startswith('LISTEN_')))\n"
    )
    argv = wrapper(fds, names, [sys.executable, "-c", code])
    if pid != "$$":
        argv[2] = argv[2].replace("LISTEN_PID=$$", f"LISTEN_PID={pid}")
    return subprocess.run(
        argv, pass_fds=fds, capture_output=True, text=True, timeout=60, env=clean_env(), check=False
    )


def test_the_reader_follows_sd_listen_fds(
    held: tuple[socket.socket, socket.socket, Path],
) -> None:
    tcp, unix, path = held
    fds = [high(tcp.fileno()), high(unix.fileno())]
    try:
        ok = read_passed(fds, [HUB_API, HUB_API])
        assert ok.returncode == 0, ok.stderr
        port = tcp.getsockname()[1]
        assert f"[('hub-api', '127.0.0.1:{port}'), ('hub-api', 'unix:{path}')]" in ok.stdout
        assert "[]" in ok.stdout.splitlines()[-1]  # the variables are gone for children
        # meant for another process (LISTEN_PID): nothing, and nothing closed
        other = read_passed(fds, [HUB_API, HUB_API], pid="1")
        assert other.returncode == 0 and other.stdout.startswith("[]"), other
        unknown = read_passed(fds, [HUB_API, "metrics"])
        assert unknown.returncode == 3 and "named 'metrics'" in unknown.stdout, unknown
        assert "FileDescriptorName=hub-api" in unknown.stdout
        miscounted = read_passed(fds, [HUB_API])
        assert miscounted.returncode == 3 and "LISTEN_FDS=2" in miscounted.stdout, miscounted
    finally:
        for fd in fds:
            os.close(fd)


def test_a_socket_that_is_not_listening_or_not_loopback_is_refused() -> None:
    with socket.socket() as idle, socket.socket() as wide:
        idle.bind(("127.0.0.1", 0))  # bound, never listening
        wide.bind(("0.0.0.0", 0))
        wide.listen()
        for sock, needle in ((idle, "not a listening stream socket"), (wide, "loopback only")):
            fd = high(sock.fileno())
            try:
                ran = read_passed([fd], [HUB_API])
            finally:
                os.close(fd)
            assert ran.returncode == 3 and needle in ran.stdout, ran
