"""Run set-up commands (pip installs, third-party suites) until they stop making progress, not
until a wall-clock limit (issue 55).

A fixed timeout on a pip install measures the machine, not the install: the same venv took
2 minutes on a quiet host and more than 10 beside a CPU hog and other builds (load average
20), and the 600 s limit failed `make test-deps` there. What a hung command looks like is a
process tree that uses no CPU at all for minutes; one that is slow because the CPUs are busy
elsewhere still gets some. So the watchdog kills a command only after `stall_s` seconds in
which its whole process tree (children included, reaped ones too) was given no CPU time; a
stalled network read is pip's own business (its socket timeout and retries)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


class Stalled(RuntimeError):
    """The command used no CPU for the whole stall window: hung, not slow."""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    return raw[raw.rindex(")") + 2 :].split()


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and every process below it, counting
    children that already exited (their time is added to their parent's `cutime`/`cstime`)."""
    parent_of: dict[int, int] = {}
    fields_of: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            fields_of[int(entry.name)] = fields
            parent_of[int(entry.name)] = int(fields[1])  # ppid (field 4 of the whole line)
    tree = {root}
    grew = True
    while grew:
        below = {pid for pid, ppid in parent_of.items() if ppid in tree} - tree
        grew = bool(below)
        tree |= below
    ticks = 0
    for pid in tree:
        fields = fields_of.get(pid)
        if fields is not None:
            # utime, stime, cutime, cstime: fields 14-17 of the line, 12-15 after the name
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / _TICKS


def run_until_stalled(
    cmd: Sequence[str],
    *,
    stall_s: float,
    what: str,
    poll_s: float = 2.0,
    **popen_kwargs: object,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True)` with no wall-clock limit: the
    command is killed (and `Stalled` raised, naming `what`) only after `stall_s` seconds in
    which its process tree used no CPU."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, **popen_kwargs)  # type: ignore[call-overload]
        used, moved_at = 0.0, time.monotonic()
        while True:
            try:
                proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            now_used = tree_cpu_seconds(proc.pid)
            if now_used > used:
                used, moved_at = now_used, time.monotonic()
            elif time.monotonic() - moved_at > stall_s:
                proc.kill()
                proc.wait()
                out.seek(0)
                err.seek(0)
                raise Stalled(
                    f"{what}: no CPU used for {stall_s:.0f} s (hung, not slow: a busy machine "
                    f"still gives it some), after {used:.1f} s of CPU; killed. Its output:\n"
                    f"{out.read()[-2000:]}\n{err.read()[-4000:]}"
                )
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(cmd), proc.returncode, out.read(), err.read())
