"""`SingleFlight`: concurrent calls for one key run once and share the result (or the error).

One class for the client (one load per kernel per process) and the daemon (one download per
variant, one ref resolution per repo and revision). A caller that re-enters a flight it leads,
on the same thread, runs `fn` itself rather than wait for itself; a forked child forgets the
parent's flights (their threads are not there).

Standard library only, no `concurrent.futures`: the client's first load imports this.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Call(Generic[V]):
    __slots__ = ("done", "error", "owner", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.owner = threading.get_ident()
        self.value: V | None = None
        self.error: BaseException | None = None


class SingleFlight(Generic[K, V]):
    """`do(key, fn)`: run `fn` once for all the threads that ask for `key` meanwhile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[K, _Call[V]] = {}
        os.register_at_fork(after_in_child=self._forget)

    def do(self, key: K, fn: Callable[[], V]) -> V:
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

    def in_flight(self) -> int:
        """How many keys are being computed now."""
        with self._lock:
            return len(self._calls)

    def _forget(self) -> None:
        """In a forked child: the parent's threads (and their calls) are not there."""
        self._lock = threading.Lock()
        self._calls = {}
