"""A test's timeout means hung, not slow (issue 55): pytest-timeout's limit becomes a stall window.

pytest-timeout fails a test after `timeout` seconds of wall clock (120 by default here). On a
busy build host the same test takes two or three times as long: a fresh clone beside a CPU hog
and two other engineers' work (load average 8-9) failed two multi-step tests that way
(test_policy_routes' deny by ref, 69 s on a quieter run; test_transformers' use_kernels,
57 s), and every step of both was working. A hung test looks different: its worker and every
process below it (daemons, jobs, containers, pip) together get almost no CPU, because they all
wait on something that will not come; a slow one still gets its share of the busy CPUs.

So this plugin implements pytest-timeout's timer hook: a thread samples the CPU time of the
worker's process tree (tests/support/watchdog.py's `tree_cpu_seconds`, less its own sampling)
and fails the test, through the same SIGALRM path pytest-timeout uses (stacks dumped, then
`pytest.fail` in the test), when the tree used less than 1% of one core over a whole window of
`timeout` seconds. A test that hangs while spinning (a retry loop that never ends) is caught by
a backstop of HANG_BACKSTOP x `timeout` of wall clock. Where the signal cannot be used (the test
does not run in the main thread), pytest-timeout's own timer runs as before.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any

import pytest

from tests.support.watchdog import tree_cpu_seconds

#: A window in which the process tree used less than this share of one core is a stall.
STALL_SHARE = 0.01
#: A test still running after this many windows of wall clock fails even if it used CPU.
HANG_BACKSTOP = 10


class StallMonitor:
    """Samples `pid`'s process tree; `verdict` is set to why the test counts as hung."""

    def __init__(self, pid: int, window: float) -> None:
        self.pid = pid
        self.window = window
        self.poll = min(5.0, max(window / 8, 0.05))
        self.verdict: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        started = moved_at = time.monotonic()
        mark = used = self._used()
        while not self._stop.wait(self.poll):
            now, used = time.monotonic(), self._used()
            if used - mark >= STALL_SHARE * self.window:
                mark, moved_at = used, now
            elif now - moved_at >= self.window:
                self.verdict = (
                    f"hung: the test's processes used {used - mark:.2f} s of CPU in the last "
                    f"{now - moved_at:.0f} s (a stall window is {self.window:g} s; a slow test "
                    f"on a busy machine still gets its share)"
                )
            if now - started >= HANG_BACKSTOP * self.window:
                self.verdict = (
                    f"still running after {now - started:.0f} s, {HANG_BACKSTOP}x its "
                    f"{self.window:g} s window, using CPU all along ({used:.1f} s): a "
                    f"loop that does not end?"
                )
            if self.verdict is not None:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)
                return

    def _used(self) -> float:
        """The tree's CPU seconds, less what this sampling thread itself spent."""
        return tree_cpu_seconds(self.pid) - time.thread_time()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own thread timer
    monitor = StallMonitor(os.getpid(), float(settings.timeout))

    def handler(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if monitor.verdict is None:
            return  # not ours (e.g. a test's own alarm that arrived late): ignore
        from pytest_timeout import dump_stacks

        terminal = item.config.get_terminal_writer()
        terminal.sep("+", title="Timeout")
        dump_stacks(terminal)
        terminal.sep("+", title="Timeout")
        pytest.fail(f"Timeout: {monitor.verdict}")

    def cancel() -> None:
        monitor.stop()
        signal.signal(signal.SIGALRM, previous)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's own attribute
    previous = signal.signal(signal.SIGALRM, handler)
    monitor.start()
    return True
