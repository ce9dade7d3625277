"""Fair shares and the refusal budget of the HTTP front
(kerneld/server/fronts/httpfront/httpshare.py)."""

from __future__ import annotations

from kerneld.server.fronts.httpfront.httpshare import FairShare, RefusalBudget


def fill(share: FairShare, uid: int, want: int) -> int:
    """Take up to `want` units as `uid`; how many it got."""
    got = 0
    while got < want and share.may_take(uid):
        share.take(uid)
        got += 1
    return got


def test_two_uids_cannot_take_everything_and_a_newcomer_always_gets_in() -> None:
    share = FairShare(512, per_uid=256, reserve=64, newcomer=8)
    assert fill(share, 1, 1000) == 256  # alone: its cap
    assert fill(share, 2, 1000) == 192  # the second: up to the reserve
    assert share.total - share.used == 64
    assert fill(share, 3, 1000) == 8  # a newcomer: its part of the reserve
    assert fill(share, 4, 1000) == 8
    assert not share.may_take(1) and not share.may_take(2)


def test_a_uid_past_its_split_waits_while_others_hold_and_gets_more_once_they_leave() -> None:
    share = FairShare(32, per_uid=16, reserve=8, newcomer=2)
    assert fill(share, 1, 100) == 16
    assert fill(share, 2, 100) == 8
    assert fill(share, 3, 100) == 2
    for _ in range(16):
        share.give(1)
    assert share.holds(1) == 0 and 1 not in share.held
    # two holders now: an equal split of the 24 unreserved is 12
    assert fill(share, 3, 100) == 10 and share.holds(3) == 12


def test_a_small_front_keeps_a_proportionate_reserve() -> None:
    share = FairShare(4, per_uid=2, reserve=8, newcomer=2)
    assert (share.reserve, share.newcomer) == (1, 1)
    assert fill(share, 1, 10) == 2
    assert fill(share, 2, 10) == 1  # the last one is the reserve's
    assert fill(share, 3, 10) == 1


def test_refusals_are_answered_at_most_per_s_a_second_per_uid() -> None:
    budget = RefusalBudget(32)
    assert sum(budget.allow(7, now=100.0) for _ in range(100)) == 32
    assert budget.allow(8, now=100.0)  # another uid has its own
    assert sum(budget.allow(7, now=100.5) for _ in range(100)) == 16
    bounded = RefusalBudget(1, max_uids=3)
    for uid in range(10):
        bounded.allow(uid, now=1.0)
    assert len(bounded._buckets) == 3
