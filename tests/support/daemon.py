"""Run the real `kerneld` as a subprocess on temporary sockets (integration tests, benchmarks).

    with DaemonProcess(tmp_path, mirror_dirs=[mirror]) as d:      # started and ready
        with d.kernels() as stub:
            stub.Resolve(...)
        d.stop(signal.SIGTERM)                                      # returns the exit code

Upstreams: `mirror_dirs=` (kerneld mirror directories, asked first), `hub_endpoint=` (a
Hub-compatible server, e.g. the `hub_server` fixture's `.url`) and/or `upstreams=` (raw
`[[upstream]]` tables: `{"kind": "mirror-http", "url": ...}`); with none of the last two the
Hub is dropped (`--no-hub`), so a test never reaches the network.

The daemon gets its own config file (`config=` as a dict of TOML tables, merged over test
defaults), store, short socket directory under /tmp (unix socket paths are limited to 107
bytes; the directory is 0755 so tests can connect as another user), HF_HOME and log file.
Also for other suites: `.user_socket`, `.admin_socket`, `.store_root`, `.stop(sig)`,
`.logs()`, `.wait_for_log()`, `.restart()`, `.kernels()` / `.admin()` stubs.
Readiness is the health service answering SERVING on the user socket, exactly as a supervisor
would probe it. Every wait is bounded.

As deployed, never as root: when the tests run as root the daemon runs as the unprivileged
system user `kerneld` (created from systemd/kerneld.sysusers by scripts/bootstrap) with that
user's groups, as the systemd unit runs it; its work, socket and store directories are handed to
it and the directories above them made traversable. A test that needs a root daemon passes
`user=None` and says why. Run as an ordinary user, the daemon is that user (user mode).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The process that imports this harness talks gRPC from several threads and forks subprocesses
# (daemons spawned as another user take fork(), not vfork()). gRPC's fork handlers, on by
# default, run in every fork and can block it for good inside the C core, where no signal
# reaches the main thread (a pytest-timeout cannot fire): seen as a CI run that stopped without a
# word, and reproduced in the bench (`__libc_fork` -> grpc's prefork handler, futex wait). This
# process never uses gRPC in a forked child, so it does not need them. gRPC reads the variable
# when it is imported: entry points set it first (tests/conftest.py, bench/run.py, chaos), this
# line covers any other. Children do not inherit it (`clean_env` and the client tests' and the
# bench's environments drop GRPC_*): jobs run with gRPC's defaults, as deployed.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kerneld_client.proto import kerneld_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNELS_SERVICE = "kerneld.v1.Kernels"
ADMIN_SERVICE = "kerneld.v1.Admin"

#: Test defaults: quick failure against dead upstreams, short drain, no surprise prefetch.
DEFAULT_CONFIG: dict[str, dict[str, Any]] = {
    "fetch": {"attempts": 2, "timeout": "5s"},
    "server": {"drain_timeout": "5s", "threads": 8},
    "store": {"gc_min_age": 0, "orphan_grace": 0, "min_free": 0},
    "log": {"level": "debug"},
    # The suite's own organisations, as a site allow-lists its own ([trust] allow); the Hub's
    # trusted-publisher check stays on for everything else (tests/daemon/test_trust.py).
    "trust": {"allow": ["kerneld-*/*"]},
}


#: The account test daemons run as when the tests run as root (see the module docstring).
DAEMON_USER = os.environ.get("KERNELD_TEST_DAEMON_USER", "kerneld")


class DaemonFailed(RuntimeError):
    """The daemon exited or never became ready; the message carries its log."""


def default_user() -> str | None:
    """`DAEMON_USER` when running as root, else None (the daemon runs as this user)."""
    return DAEMON_USER if os.geteuid() == 0 and DAEMON_USER else None


def account(user: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise DaemonFailed(
            f"test daemons run as the unprivileged user {user!r}, which does not exist: run "
            "scripts/bootstrap (it creates it from systemd/kerneld.sysusers), or set "
            "KERNELD_TEST_DAEMON_USER to another account"
        ) from None


def user_groups(user: str) -> list[int]:
    """Supplementary groups of `user` (the unit gives kerneld kerneld-users and kerneld-admin)."""
    return [g.gr_gid for g in grp.getgrall() if user in g.gr_mem]


def grant_traversal(path: Path) -> None:
    """Let other users traverse the directories above `path` that this process created under the
    temp directory (pytest's are 0700); nothing outside the temp directory is touched."""
    top = Path(tempfile.gettempdir()).resolve()
    for parent in Path(path).resolve().parents:
        if parent == top or top not in parent.parents:
            break
        st = parent.stat()
        if st.st_uid == os.geteuid() and not st.st_mode & 0o001:
            parent.chmod((st.st_mode & 0o7777) | 0o011)


def daemon_dir(prefix: str = "kd-") -> Path:
    """A short new directory under /tmp that the test daemon may write (sockets, outputs)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    user = default_user()
    if user is not None:
        pw = account(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def hand_over(path: Path, uid: int, gid: int) -> None:
    """Give `path` and everything below it to uid:gid (the daemon's own directories)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(doc: Mapping[str, Any]) -> str:
    """A TOML document from {table: {key: value}} and {"upstream": [{...}, ...]}."""
    lines: list[str] = []
    for key, value in doc.items():
        if not isinstance(value, Mapping | list):
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in doc.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{key}]"] + [f"{k} = {toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for item in value:
                lines += ["", f"[[{key}]]"] + [f"{k} = {toml_value(v)}" for k, v in item.items()]
        elif isinstance(value, list):
            lines.insert(0, f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without anything that would steer the daemon."""
    drop = (
        "KERNELD_",
        "HF_",
        "GRPC_",
        "NOTIFY_SOCKET",
        "WATCHDOG_",
        "JOURNAL_STREAM",
        "INVOCATION_ID",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Default:
    """Marker: the daemon runs as `default_user()`."""


DEFAULT = Default()


class DaemonProcess:
    """One kerneld subprocess; a context manager that starts it and stops it (SIGTERM)."""

    def __init__(
        self,
        workdir: Path,
        *,
        store: Path | None = None,
        hub_endpoint: str | None = None,
        mirror_dirs: Sequence[Path] = (),
        upstreams: Sequence[Mapping[str, str]] = (),
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        socket_dir: Path | None = None,
        user_socket: Path | None = None,
        admin_socket: Path | None = None,
        hardware_root: Path | None = None,
        ready_timeout: float = 20.0,
        user: str | Default | None = DEFAULT,
    ) -> None:
        self.user = default_user() if isinstance(user, Default) else user
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.store_root = Path(store) if store is not None else self.workdir / "store"
        self._own_socket_dir = socket_dir is None
        if socket_dir is None:
            socket_dir = Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp"))
            socket_dir.chmod(0o755)
        self.socket_dir = socket_dir
        self.user_socket = user_socket or socket_dir / "kerneld.sock"
        self.admin_socket = admin_socket or socket_dir / "admin.sock"
        self.config_path = self.workdir / "kerneld.toml"
        self.config = merge(DEFAULT_CONFIG, config or {})
        if upstreams:
            self.config["upstream"] = [dict(u) for u in upstreams]
        self.write_config()
        self.hub_endpoint = hub_endpoint
        self.mirror_dirs = list(mirror_dirs)
        self.extra_env = dict(env or {})
        self.extra_args = list(args)
        self.hardware_root = hardware_root
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.starts = 0
        self.log_path = self.workdir / "kerneld-0.log"
        #: Descriptors the process inherits (socket activation, test_socket_activation.py).
        self.pass_fds: tuple[int, ...] = ()

    # ---- configuration --------------------------------------------------------------------

    def write_config(self, config: Mapping[str, Any] | None = None) -> None:
        """(Re)write the config file; `config` merges over the current one (then SIGHUP)."""
        if config is not None:
            self.config = merge(self.config, config)
        self.config_path.write_text(to_toml(self.config), encoding="utf-8")

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "kerneld.server.main",
            "--config",
            str(self.config_path),
            "--store",
            str(self.store_root),
            "--socket",
            str(self.user_socket),
            "--admin-socket",
            str(self.admin_socket),
        ]
        for mirror in self.mirror_dirs:
            cmd += ["--upstream-mirror-dir", str(mirror)]
        if self.hub_endpoint:
            cmd += ["--hub-endpoint", self.hub_endpoint]
        elif "upstream" not in self.config:
            cmd.append("--no-hub")
        if self.hardware_root is not None:
            cmd += ["--hardware-root", str(self.hardware_root)]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        extra = {"HF_HOME": str(self.workdir / "hf-home")}
        if self.user is not None:
            home = self.workdir / "home"
            home.mkdir(exist_ok=True)
            extra.update(HOME=str(home), USER=self.user, LOGNAME=self.user)
        return clean_env({**extra, **self.extra_env})

    def prepare_user(self) -> dict[str, Any]:
        """Hand the daemon's directories to its user; the Popen arguments that switch to it."""
        if self.user is None:
            return {}
        pw = account(self.user)
        dirs = [self.workdir, self.socket_dir, self.store_root]
        dirs += [p.parent for p in (self.user_socket, self.admin_socket)]
        for d in dirs:
            grant_traversal(d)
        if not self.store_root.exists():
            # as tmpfiles.d/StateDirectory= do for the unit: the store directory is the daemon's
            self.store_root.mkdir(parents=True)
            os.chown(self.store_root, pw.pw_uid, pw.pw_gid)
        for d in (self.workdir, self.socket_dir):
            if d.exists() and d.stat().st_uid == os.geteuid() and os.geteuid() != pw.pw_uid:
                hand_over(d, pw.pw_uid, pw.pw_gid)
        for extra in [*self.mirror_dirs, self.hardware_root]:
            if extra is not None:
                grant_traversal(Path(extra) / "x")
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": user_groups(self.user)}

    # ---- lifecycle ------------------------------------------------------------------------

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for readiness."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the daemon is already running")
        self.log_path = self.workdir / f"kerneld-{self.starts}.log"
        self.starts += 1
        self.returncode = None
        as_user = self.prepare_user()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=self.pass_fds,
                **as_user,
            )
        return self.proc

    def start(self) -> DaemonProcess:
        self.spawn()
        self.wait_ready()
        return self

    def health(self, socket: Path | None = None, service: str = KERNELS_SERVICE) -> int | None:
        """The health status on `socket` (default: the user socket), None if unreachable."""
        target = socket or self.user_socket
        if not target.exists():
            return None
        with grpc.insecure_channel(f"unix:{target}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
            except grpc.RpcError:
                return None
            return int(reply.status)

    def wait_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise DaemonFailed(
                    f"kerneld exited with {self.proc.returncode} before it was ready:\n"
                    + self.logs()
                )
            if self.health() == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.03)
        raise DaemonFailed(f"kerneld not ready within the timeout:\n{self.logs()}")

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            raise DaemonFailed(f"kerneld did not exit within {timeout}s:\n{self.logs()}") from None
        return self.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send `sig` and wait for the exit; returns the exit code (killed after `timeout`)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.send_signal(sig)
        return self.wait(timeout)

    def restart(self) -> DaemonProcess:
        self.stop()
        return self.start()

    @property
    def uid(self) -> int:
        """The uid the daemon runs as (owner of its sockets and store)."""
        return account(self.user).pw_uid if self.user is not None else os.geteuid()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        """Every log of this daemon so far (all starts), oldest first."""
        parts = []
        for i in range(self.starts):
            path = self.workdir / f"kerneld-{i}.log"
            if path.exists():
                parts.append(path.read_text(encoding="utf-8", errors="replace"))
        return "".join(parts)

    def wait_for_log(self, needle: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logs()
            if needle in text:
                return text
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{self.logs()}")

    def close(self) -> None:
        try:
            if self.running():
                self.stop()
        finally:
            if self._own_socket_dir:
                shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- clients --------------------------------------------------------------------------

    @contextmanager
    def channel(self, admin: bool = False) -> Iterator[grpc.Channel]:
        target = self.admin_socket if admin else self.user_socket
        with grpc.insecure_channel(f"unix:{target}") as channel:
            yield channel

    @contextmanager
    def kernels(self) -> Iterator[kerneld_pb2_grpc.KernelsStub]:
        with self.channel() as channel:
            yield kerneld_pb2_grpc.KernelsStub(channel)

    @contextmanager
    def admin(self) -> Iterator[kerneld_pb2_grpc.AdminStub]:
        with self.channel(admin=True) as channel:
            yield kerneld_pb2_grpc.AdminStub(channel)


def wait_until(check: Callable[[], bool], d: DaemonProcess, timeout: float = 10) -> None:
    """Poll `check` until it holds; past `timeout`, fail with the daemon's log."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, d.logs()
        time.sleep(0.05)
