"""One load per kernel at a time in a process, without one slow kernel blocking the others.

Threads that ask for the same key while a call for it is running wait for that call and
share its outcome; calls for other keys run alongside. (The loader used to hold one
process-wide lock across a whole daemon fetch, up to `KERNELD_FETCH_TIMEOUT`, so a kernel
being downloaded stopped every other thread's load, warm ones included.) A call that
re-enters its own key on the same thread, as a kernel importing itself would, runs directly
instead of waiting for itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Call(Generic[T]):
    __slots__ = ("done", "error", "owner", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.owner = threading.get_ident()
        self.value: T | None = None
        self.error: BaseException | None = None


class SingleFlight(Generic[T]):
    """`do(key, fn)`: run `fn` once for all the threads that ask for `key` meanwhile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[T]] = {}
        os.register_at_fork(after_in_child=self._forget)

    def do(self, key: Hashable, fn: Callable[[], T]) -> T:
        with self._lock:
            call = self._calls.get(key)
            leader = call is None
            if call is None:
                call = self._calls[key] = _Call()
        if not leader:
            if call.owner == threading.get_ident():
                return fn()  # re-entered on the same thread: waiting would be for ourselves
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.value  # type: ignore[return-value]
        try:
            call.value = fn()
            return call.value
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()

    def _forget(self) -> None:
        """In a forked child: the parent's threads (and their calls) are not there."""
        self._lock = threading.Lock()
        self._calls = {}
