"""The set-up watchdog (tests/support/watchdog.py) kills what is hung and keeps what is slow."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support.watchdog import Stalled, run_until_stalled, tree_cpu_seconds


def _spin(seconds: float) -> list[str]:
    """A python that uses `seconds` of CPU, however long the machine takes to give it them."""
    code = f"import time\ne = time.process_time() + {seconds}\nwhile time.process_time() < e: pass"
    return [sys.executable, "-c", code]


def test_a_command_that_works_longer_than_the_stall_window_is_not_killed() -> None:
    # 2 s of CPU in a grandchild (through a shell) against a 1 s window: the whole tree counts,
    # and on a busy machine this takes far longer than the window in wall time
    script = " ".join(f"'{a}'" for a in _spin(2)) + " && echo done"
    done = run_until_stalled(["sh", "-c", script], stall_s=1, poll_s=0.2, what="busy")
    assert (done.returncode, done.stdout) == (0, "done\n")


def test_a_command_that_uses_no_cpu_is_killed_and_named() -> None:
    started = time.monotonic()
    with pytest.raises(Stalled, match=r"sleeper: no CPU used for 1 s"):
        run_until_stalled(["sh", "-c", "sleep 60"], stall_s=1, poll_s=0.2, what="sleeper")
    assert time.monotonic() - started < 50  # killed, not waited out


def test_the_exit_status_and_output_come_back() -> None:
    done = run_until_stalled(["sh", "-c", "echo out; echo err >&2; exit 3"], stall_s=5, what="x")
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_tree_cpu_counts_children_that_exited() -> None:
    before = tree_cpu_seconds(os.getpid())
    subprocess.run(_spin(0.5), check=True)
    assert tree_cpu_seconds(os.getpid()) - before >= 0.4
