"""Holds: in-memory protection of variants from GC while a request is using them.

A lease (a row in the index) protects a tree a client was handed. Before that row exists there
is a window: a fetch publishes a tree, and the next reservation (another fetch, the next
variant of the same prefetch, a dependency of the same Resolve) runs GC under the cap and may
evict it before its requester has looked it up, granted a lease or answered. containerd closes
the same window by ingesting content under a lease taken *before* the write; a hold is that
lease for kerneld: a request names the variants it wants (repo, commit, variant) before it
looks them up or fetches them, and GC keeps whatever tree those names point at until the
request ends. Holding names rather than trees covers a fetch shared by several requests (a
single-flight): every waiter is protected from the moment it asked, whoever finishes first.

Holds live in the daemon's memory only: a crash ends the request and its holds with it.
A hold that cannot be kept under the cap is not broken: the reservation that would need its
space fails with a typed ResourceExhaustedError instead.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

VariantKey = tuple[str, str, str]
"""(repo, commit, variant)."""


class Hold:
    """The variants one request keeps from GC; `add` them before looking them up."""

    def __init__(self, registry: Holds) -> None:
        self._registry = registry
        self._keys: list[VariantKey] = []

    def add(self, repo: str, commit: str, variant: str) -> None:
        key = (repo, commit, variant)
        if key not in self._keys:
            self._keys.append(key)
            self._registry._take(key)

    def _release(self) -> None:
        keys, self._keys = self._keys, []
        self._registry._give_back(keys)


class Holds:
    """Every open hold of one store (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: Counter[VariantKey] = Counter()

    @contextmanager
    def hold(self) -> Iterator[Hold]:
        """A hold for the duration of a request; released on exit, whatever happened."""
        h = Hold(self)
        try:
            yield h
        finally:
            h._release()

    def held(self) -> set[VariantKey]:
        """The variants some open request holds (a snapshot, for GC)."""
        with self._lock:
            return set(self._count)

    def _take(self, key: VariantKey) -> None:
        with self._lock:
            self._count[key] += 1

    def _give_back(self, keys: list[VariantKey]) -> None:
        with self._lock:
            for key in keys:
                self._count[key] -= 1
                if self._count[key] <= 0:
                    del self._count[key]
