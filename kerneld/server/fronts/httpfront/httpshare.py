"""Fair shares of one HTTP front's connection slots and workers among the uids that use it
(`kerneld/server/fronts/httpfront/httpd.py`), and the budget of refusals it answers.

A fixed per-uid cap lets a few uids take everything (two members at 256 connections each
filled the endpoint's 512; two at 16 workers each held all 32). So a uid's cap is a share of
what the front has: a `reserve` is kept for uids that hold less than `newcomer` units (however
many others hold, a newcomer always gets in while anything is free), and a uid already past
`newcomer` may take another unit only while more than the reserve is free and while it holds
less than an equal split of the rest among the uids holding any (and at most `per_uid`).

Refusals cost the front: an answer written and a descriptor kept a moment so that it is read.
An outsider's connect flood gets at most `per_s` answers a second per uid (the rest are closed
unanswered): the refusal says why once, the flood costs an accept and a close.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class FairShare:
    """Units (connections, workers) of one front held per uid; `may_take` decides."""

    def __init__(self, total: int, *, per_uid: int, reserve: int, newcomer: int) -> None:
        """`reserve` is clamped to a quarter of `total`, `newcomer` to the reserve (a front with
        four workers keeps one for newcomers, not eight)."""
        self.total = max(1, total)
        self.per_uid = max(1, per_uid)
        self.reserve = max(0, min(reserve, self.total // 4))
        self.newcomer = max(1, min(newcomer, self.reserve)) if self.reserve else 1
        self.held: dict[int, int] = {}
        self.used = 0

    def holds(self, uid: int) -> int:
        return self.held.get(uid, 0)

    def cap(self, uid: int) -> int:
        """What `uid` may hold now: an equal split of what is not reserved among the uids
        holding any (itself counted), at least the newcomer's part, at most `per_uid`."""
        holders = len(self.held) + (0 if uid in self.held else 1)
        split = (self.total - self.reserve) // max(1, holders)
        return min(self.per_uid, max(self.newcomer, split))

    def may_take(self, uid: int) -> bool:
        """May `uid` take one more unit now?"""
        free = self.total - self.used
        held = self.holds(uid)
        if free <= 0 or held >= self.per_uid:
            return False
        if held < self.newcomer:
            return True  # the reserve is for exactly these
        return free > self.reserve and held < self.cap(uid)

    def take(self, uid: int) -> None:
        self.held[uid] = self.held.get(uid, 0) + 1
        self.used += 1

    def give(self, uid: int) -> None:
        left = self.held.get(uid, 0) - 1
        if left > 0:
            self.held[uid] = left
        else:
            self.held.pop(uid, None)
        if self.used > 0:
            self.used -= 1


class RefusalBudget:
    """Answers to refused connections, per uid: a token bucket of `per_s` a second (bursts of
    `per_s`); a uid out of tokens has its connections closed unanswered. Bounded: the least
    recently refused uids are forgotten past `max_uids`."""

    def __init__(self, per_s: float, *, max_uids: int = 4096) -> None:
        self.per_s = max(1.0, per_s)
        self.max_uids = max_uids
        self._buckets: OrderedDict[int, tuple[float, float]] = OrderedDict()

    def allow(self, uid: int, now: float | None = None) -> bool:
        """Spend one answer of `uid`'s budget, if it has one left."""
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(uid, (self.per_s, now))
        tokens = min(self.per_s, tokens + (now - last) * self.per_s)
        ok = tokens >= 1.0
        self._buckets[uid] = (tokens - 1.0 if ok else tokens, now)
        self._buckets.move_to_end(uid)
        while len(self._buckets) > self.max_uids:
            self._buckets.popitem(last=False)
        return ok
