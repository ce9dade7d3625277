"""The daemon as the unit confines it, for attack tests: its `MemoryMax=1G` and `TasksMax=512`
(a cgroup made here), and its `ProtectProc=invisible` (a private /proc with hidepid).

The cgroup is a cgroup v2 child where the unified hierarchy has the memory and pids
controllers, else v1 `memory` and `pids` children (a hybrid host); a test that can make
neither skips with the reason. Only the daemon's process is moved in: the attackers and the
victims stay outside, as on a real node.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess

UNIT_MEMORY_MAX = 1 << 30  # MemoryMax=1G
UNIT_TASKS_MAX = 512  # TasksMax=512
CGROUP = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str:
    """This process's cgroup path in a hierarchy ('' for v2's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return "/"


@dataclass
class UnitLimits:
    """The cgroup directories holding the daemon, and what they saw."""

    memory: Path
    pids: Path
    v2: bool

    def oom_kills(self) -> int:
        if self.v2:
            events = (self.memory / "memory.events").read_text()
        else:
            events = (self.memory / "memory.oom_control").read_text()
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError):
            return int((self.memory / name).read_text())
        return -1

    def tasks(self) -> int:
        return int((self.pids / "pids.current").read_text())


def _make(parent: Path, files: dict[str, str]) -> Path:
    path = parent / f"kerneld-test-{secrets.token_hex(4)}"
    path.mkdir()
    try:
        for name, value in files.items():
            (path / name).write_text(value)
    except OSError:
        path.rmdir()
        raise
    return path


@contextmanager
def unit_limits() -> Iterator[UnitLimits]:
    """A cgroup with the unit's memory and task limits (`add` the daemon to it)."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    made: list[Path] = []
    try:
        unified = CGROUP / "cgroup.controllers"
        controllers = unified.read_text().split() if unified.exists() else []
        if {"memory", "pids"} <= set(controllers):
            parent = CGROUP / _own_path("").lstrip("/")
            cg = _make(
                parent,
                {
                    "memory.max": str(UNIT_MEMORY_MAX),
                    "memory.swap.max": "0",
                    "pids.max": str(UNIT_TASKS_MAX),
                },
            )
            made.append(cg)
            limits = UnitLimits(cg, cg, v2=True)
        else:
            memory = CGROUP / "memory" / _own_path("memory").lstrip("/")
            pids = CGROUP / "pids" / _own_path("pids").lstrip("/")
            mem = _make(memory, {"memory.limit_in_bytes": str(UNIT_MEMORY_MAX)})
            made.append(mem)
            with contextlib.suppress(OSError):  # no swap accounting: swap off is enough
                (mem / "memory.memsw.limit_in_bytes").write_text(str(UNIT_MEMORY_MAX))
            made.append(_make(pids, {"pids.max": str(UNIT_TASKS_MAX)}))
            limits = UnitLimits(mem, made[-1], v2=False)
    except OSError as exc:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                path.rmdir()
        pytest.skip(f"cannot make a cgroup with the unit's limits here: {exc}")
    try:
        yield limits
    finally:
        for path in reversed(made):
            for _ in range(50):  # the daemon's exit empties it a moment later
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def confine(daemon: DaemonProcess, limits: UnitLimits) -> None:
    """Move the (just spawned) daemon process into the cgroup; its threads follow."""
    pid = str(daemon.pid)
    (limits.memory / "cgroup.procs").write_text(pid)
    if limits.pids != limits.memory:
        (limits.pids / "cgroup.procs").write_text(pid)


class HiddenProcDaemon(DaemonProcess):
    """The daemon in a mount namespace whose /proc hides other users' processes
    (`hidepid=invisible`, what the unit's `ProtectProc=invisible` gives it). Started as root
    to mount that /proc, it becomes its user (`setpriv`) before Python starts."""

    def prepare_user(self) -> dict[str, Any]:
        self._ids = super().prepare_user()
        return {}

    def command(self) -> list[str]:
        inner = super().command()
        ids = getattr(self, "_ids", {})
        if not ids:
            raise RuntimeError("HiddenProcDaemon runs the daemon as its user: run as root")
        groups = ",".join(str(g) for g in ids["extra_groups"]) or "-"
        switch = ["setpriv", f"--reuid={ids['user']}", f"--regid={ids['group']}"]
        switch += ["--clear-groups"] if groups == "-" else [f"--groups={groups}"]
        mount = 'mount -t proc -o hidepid=invisible proc /proc && exec "$@"'
        unshare = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", mount, "sh"]
        return [*unshare, *switch, "--", *inner]
