"""The daemon's background-thread shape: a failing turn never ends the thread, `stop_on`
exceptions end it quietly, `wake()` cuts a sleep short and `stop()` ends it."""

from __future__ import annotations

import threading

from kerneld.server.services.background import BackgroundThread

WAIT_S = 10.0


class Stopping(Exception):
    pass


class Counter(BackgroundThread):
    name = "test-counter"
    stop_on = (Stopping,)

    def __init__(self, script: list[object]) -> None:
        super().__init__()
        self.script = script
        self.turns = 0
        self.failures: list[str] = []
        self.turned = threading.Event()

    def turn(self) -> float | None:
        self.turns += 1
        self.turned.set()
        step = self.script.pop(0) if self.script else 3600.0
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[return-value]

    def failed(self, exc: Exception) -> float:
        self.failures.append(str(exc))
        return 0.0


def test_a_failed_turn_is_retried_and_a_stop_exception_ends_the_thread() -> None:
    t = Counter([RuntimeError("boom"), 0.0, Stopping()])
    t.start()
    t.join(WAIT_S)
    assert t._thread is not None and not t._thread.is_alive()
    assert t.turns == 3 and t.failures == ["boom"]


def test_wake_cuts_the_sleep_short_and_stop_ends_it() -> None:
    t = Counter([3600.0])
    t.start()
    assert t.turned.wait(WAIT_S)
    t.turned.clear()
    t.wake()  # the hour-long sleep ends now: a second turn
    assert t.turned.wait(WAIT_S)
    t.stop()
    t.join(WAIT_S)
    assert t._thread is not None and not t._thread.is_alive()
    assert t.turns == 2


def test_none_ends_the_thread() -> None:
    t = Counter([None])
    t.start()
    t.join(WAIT_S)
    assert t._thread is not None and not t._thread.is_alive() and t.turns == 1
