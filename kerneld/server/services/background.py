"""The daemon's background threads share one shape: do what is due, sleep until the next turn
or a `wake()`, stop when asked. The scheduled prefetch, the ref re-check and the scrub each
subclass `BackgroundThread` and say only what a turn does and what a failure means.

A failure never kills the thread (a daemon that silently stopped scrubbing or re-checking refs
would be worse than one that logs and tries again); only the exceptions in `stop_on`, which mean
the daemon itself is stopping, end it.
"""

from __future__ import annotations

import threading


class BackgroundThread:
    """One named daemon thread; `wake()` after a config change, `stop()` at shutdown."""

    name = "background"
    #: Exceptions that mean the daemon is stopping: the thread ends without a word.
    stop_on: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look again now (a reload changed the schedule, a test moved the clock)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def turn(self) -> float | None:
        """Do what is due; seconds until the next turn (0: at once), None to end the thread."""
        raise NotImplementedError

    def failed(self, exc: Exception) -> float:
        """A turn raised `exc` (not one of `stop_on`): say so; seconds until the next try."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.turn()
            except self.stop_on:
                return
            except Exception as exc:  # never let the thread die
                wait = self.failed(exc)
            if wait is None:
                return
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
