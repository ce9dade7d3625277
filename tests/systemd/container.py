"""systemd as PID 1 in a throw-away container, for tests of the documented install.

`Container` boots `systemd-nspawn --boot --register=no --keep-unit` on an overlay of the host
root, so the container has this host's packages, Python and repository without a copy:

- never on the host root itself: Debian's tmpfiles.d/tmp.conf has `D /tmp`, and a boot would
  empty the host's /tmp;
- the overlay's upper and work directories live on a private tmpfs, so the upper layer is not
  itself visible through the lower one (the host root) and one unmount discards every change;
  only the root file system is overlaid (the container gets its own /proc, /sys, /dev, /run and
  /tmp from nspawn and systemd), so host paths outside those, the repository included, are
  visible read-only-in-effect;
- `--register=no --keep-unit`: no machined and no systemd on the host are needed (nor used);
  hence no `machinectl shell`/`systemd-run -M`: commands enter the container with
  `nsenter --target <its PID 1> --all`, which gives them its mount, PID, IPC, UTS and cgroup
  namespaces (and its root), so `systemctl` talks to the container's systemd;
- the network namespace is the host's (no `--private-network`): a loopback HTTP server of the
  test is reachable from services in the container;
- booted into `basic.target` (`systemd.unit=` on PID 1's command line): the host's enabled
  services (a web server, a database) would otherwise start on the shared network;
- `close()` always cleans up, with bounded waits: SIGTERM to nspawn (the container powers off
  cleanly), SIGKILL to nspawn and the container's PID 1 after a grace period (the kernel then
  kills everything in the container), then unmount (lazily if still busy) and remove.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: What every command in the container gets as its environment (nothing of the test's).
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "TERM": "dumb",
}
TOOLS = ("systemd-nspawn", "nsenter", "mount", "umount")


class ContainerUnavailable(Exception):
    """This machine cannot run the container at all (the reason is the message): skip."""


class ContainerFailed(AssertionError):
    """The container was started but did not come up; the message carries its console."""


@dataclass(frozen=True)
class Ran:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str

    def __str__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\n-> exit {self.rc}\n"
            f"--- stdout ---\n{self.out[-4000:]}\n--- stderr ---\n{self.err[-4000:]}"
        )


def unavailable_reason() -> str | None:
    """Why this machine cannot boot the container, or None if it may try."""
    if os.geteuid() != 0:
        return "booting systemd in a container needs root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (packages systemd-container, util-linux)"
    return None


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


def _umount(path: Path) -> None:
    for attempt in range(10):
        result = subprocess.run(["umount", str(path)], capture_output=True, text=True, timeout=30)
        if result.returncode == 0 or not os.path.ismount(path):
            return
        time.sleep(0.2 * (attempt + 1))
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True, timeout=30)


#: The repository: the tests run their commands from it inside the container.
REPOSITORY = Path(__file__).resolve().parents[2]
#: Where the container gets file systems of its own (nspawn's tmpfs on /tmp; systemd's /run),
#: so host paths below them are not visible through the overlay of the host root.
_OWN_MOUNTS = (Path("/tmp"), Path("/run"), Path("/dev/shm"))


def _nspawn_path(path: Path) -> str:
    """`path` as one field of an nspawn `--bind`/`--overlay` value: `:` separates the fields
    there and `\\` escapes, so both are escaped (spaces need nothing: one argv element)."""
    return str(path).replace("\\", "\\\\").replace(":", "\\:")


def _private_paths(repository: Path = REPOSITORY) -> list[str]:
    """nspawn options that show the repository in the container when it lives below a path
    the container has its own file system on (a checkout under /tmp, as CI may make): an
    overlay with a throw-away upper layer, so the container writes nothing back.

    The overlay is of the first folder below that path (`/tmp/a` for `/tmp/a/b/kd`), not of the
    repository itself: nspawn creates an overlay's mount point but not its parents, and the
    container's own /tmp is empty, so a deeper mount point cannot be made."""
    for own in _OWN_MOUNTS:
        if repository.is_relative_to(own) and repository != own:
            top = own / repository.relative_to(own).parts[0]
            return [f"--overlay={_nspawn_path(top)}::{_nspawn_path(top)}"]
    return []


class Container:
    """One booted container; use as a context manager (always torn down)."""

    def __init__(
        self,
        base: Path,
        name: str,
        *,
        tmpfs_size: str = "4g",
        private_network: bool = False,
        repository: Path = REPOSITORY,
    ) -> None:
        """`private_network`: a network namespace of its own with only a loopback device
        (its ports are nobody else's; it reaches nothing outside); else this machine's.
        `repository`: the checkout the container must see at its host path (this one)."""
        self.repository = repository
        self.base = base
        self.private_network = private_network
        self.name = name
        self.layers = base / "layers"
        self.root = base / "root"
        self.console = base / "console.log"
        self.tmpfs_size = tmpfs_size
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0
        self.boot_s = 0.0
        self.failed_units = ""
        self._mounted: list[Path] = []

    # ---- set-up ---------------------------------------------------------------------------

    def mount(self) -> None:
        """The overlay of the host root; raises ContainerUnavailable if mounts are refused."""
        for path in (self.layers, self.root):
            path.mkdir(parents=True, exist_ok=True)
        options = f"size={self.tmpfs_size},mode=0700"
        tmpfs = _mount("-t", "tmpfs", "-o", options, "tmpfs", str(self.layers))
        if tmpfs.returncode != 0:
            raise ContainerUnavailable(f"cannot mount a tmpfs: {tmpfs.stderr.strip()}")
        self._mounted.append(self.layers)
        upper, work = self.layers / "upper", self.layers / "work"
        upper.mkdir()
        work.mkdir()
        options = f"lowerdir=/,upperdir={upper},workdir={work}"
        overlay = _mount("-t", "overlay", "overlay", "-o", options, str(self.root))
        if overlay.returncode != 0:
            raise ContainerUnavailable(f"cannot mount an overlay of /: {overlay.stderr.strip()}")
        self._mounted.append(self.root)

    def boot(self, timeout: float = 90.0) -> None:
        """Start systemd in the container and wait until its start-up is done."""
        with open(self.console, "wb") as console:
            self.proc = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "--boot",
                    "--register=no",
                    "--keep-unit",
                    f"--directory={self.root}",
                    f"--machine={self.name}",
                    "--console=read-only",
                    *_private_paths(self.repository),
                    *(["--private-network"] if self.private_network else []),
                    "systemd.unit=basic.target",
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=dict(BASE_ENV),
            )
        started = time.monotonic()
        deadline = started + timeout
        self.leader = self._wait_for_leader(deadline)
        state = ""
        while time.monotonic() < deadline:
            ran = self.run(["systemctl", "is-system-running"], timeout=10)
            state = ran.out.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.2)
        else:
            raise ContainerFailed(f"systemd did not finish booting ({state!r}):\n{self.tail()}")
        if state == "degraded":  # a host unit that cannot run in a container; noted, not fatal
            self.failed_units = self.run(["systemctl", "--failed", "--no-legend", "--plain"]).out
        self.boot_s = time.monotonic() - started

    def _wait_for_leader(self, deadline: float) -> int:
        """The container's PID 1 as the host sees it: nspawn's child once it runs systemd."""
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ContainerFailed(
                    f"systemd-nspawn exited with {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                for pid in children.read_text().split():
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                        return int(pid)
            except OSError:
                pass
            time.sleep(0.05)
        raise ContainerFailed(f"no systemd in the container in time:\n{self.tail()}")

    # ---- use ------------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float = 60.0,
    ) -> Ran:
        """Run `argv` in the container (as `user` through `runuser`, which takes that user's
        groups from the container's /etc/group) with a clean environment plus `env`."""
        inner = list(argv) if user is None else ["runuser", "-u", user, "--", *argv]
        cmd = ["nsenter", f"--target={self.leader}", "--all", *inner]
        try:
            done = subprocess.run(
                cmd,
                input=stdin,
                capture_output=True,
                text=True,
                env={**BASE_ENV, **(env or {})},
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return Ran(tuple(inner), 124, out, err + f"\n(timed out after {timeout}s)")
        return Ran(tuple(inner), done.returncode, done.stdout, done.stderr)

    def journal(self, unit: str) -> str:
        return self.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit]).out

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.console.read_bytes().decode(errors="replace")
        except OSError:
            return "(no console output)"
        return "\n".join(text.splitlines()[-lines:])

    # ---- tear-down ------------------------------------------------------------------------

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # nspawn: a clean poweroff of the container
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                for pid in (self.leader, self.proc.pid):
                    if pid:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        for path in reversed(self._mounted):
            _umount(path)
        self._mounted.clear()
        propagate = Path("/run/systemd/nspawn/propagate") / self.name
        if propagate.is_dir() and not os.path.ismount(propagate):
            shutil.rmtree(propagate, ignore_errors=True)
        for path in (self.root, self.layers):
            if path.is_dir() and not os.path.ismount(path):
                shutil.rmtree(path, ignore_errors=True)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
