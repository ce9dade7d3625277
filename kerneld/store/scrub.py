"""The periodic scrub: re-hash every live tree and blob, slowly, and take damaged ones out.

``kerneldctl verify`` checks the whole store at once, at full speed, when an admin asks. A disk
that rots does not wait for an admin, so the daemon also walks the store in the background
(``[store] scrub_interval``), one tree at a time, at a bounded byte rate (``scrub_rate``):

1. the live trees, in digest order, each against its manifest (content, sizes, modes, owner,
   no extra or missing file); a tree file that hashed correctly vouches for the blob it is hard
   linked to (same inode), so most blobs are not read twice;
2. every live blob no tree file vouched for.

A finding is confirmed by checking the tree (or blob) again at full speed before anything is
changed: a tree that GC removed or replaced during the slow pass, or a transient read error,
is not a reason to drop a good tree. Confirmed damage is handed to ``store.repair.invalidate``:
the rows go dead at once (clients see a miss from then on), the files are moved into the
quarantine (never deleted: on an air-gapped host they may be the only copy), and the caller
re-fetches the invalidated variants from upstream, dropping the quarantined copy once the
variants are served again.

No store lock is held while hashing: resolves, publishes and GC go on during a scrub. Progress
(the last digest finished) is kept in the index, so a daemon restarted in the middle of a long
pass resumes it instead of starting over and never finishing.

The store holds one `Scrub` as ``store.scrub`` (``interfaces.Scrubbing``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kerneld.errors import ErrorKind

from .index import Index
from .layout import Layout
from .lookup import Lookups
from .meta import Meta
from .repair import Repairer
from .verify import Problem, Quarantined, VerifyReport, verify_blob, verify_tree

log = logging.getLogger("kerneld.store.scrub")


@dataclass(frozen=True)
class _Parts:
    """What a scrub reads and changes: the files and rows themselves (it re-hashes them), the
    owner every file must have, and the parts it records progress and repairs through."""

    index: Index
    layout: Layout
    owner_uid: int
    meta: Meta
    catalog: Lookups
    repair: Repairer


class Scrub:
    """``store.scrub``: a slow pass over the store, or one tree checked now."""

    def __init__(
        self,
        index: Index,
        layout: Layout,
        *,
        owner_uid: int,
        meta: Meta,
        catalog: Lookups,
        repair: Repairer,
    ) -> None:
        self._parts = _Parts(index, layout, owner_uid, meta, catalog, repair)

    def run_pass(
        self,
        *,
        rate: int,
        stop: threading.Event,
        on_damage: Callable[[Damage], None] | None = None,
    ) -> ScrubReport:
        """`scrub_pass` on this store."""
        return scrub_pass(self._parts, rate=rate, stop=stop, on_damage=on_damage)

    def check_tree(
        self, digest: str, *, on_damage: Callable[[Damage], None] | None = None
    ) -> ScrubReport:
        """`check_tree_now` on this store."""
        return check_tree_now(self._parts, digest, on_damage=on_damage)


#: Index meta keys.
META_LAST = "scrub_last_completed_at"
META_CURSOR = "scrub_cursor"
#: How often (seconds) the resume cursor is written during a pass.
CURSOR_EVERY_S = 30.0
#: Cursor value once every tree is done (sorts after any hex digest): resume with the blobs.
TREES_DONE = "~"


class ScrubCancelled(Exception):
    """The daemon is stopping: the pass ends where it is (the cursor says where to resume)."""

    kind = ErrorKind.INTERNAL


@dataclass(frozen=True)
class Damage:
    """One confirmed finding, with the variants that used the damaged tree or blob."""

    problem: Problem
    variants: tuple[tuple[str, str, str], ...]
    """(repo, commit, variant) published from the damaged tree (or trees using the blob)."""


@dataclass
class ScrubReport:
    trees_checked: int = 0
    blobs_checked: int = 0
    bytes_hashed: int = 0
    seconds: float = 0.0
    resumed_after: str = ""
    """The digest a resumed pass started after ("" for a pass from the start)."""
    completed: bool = False
    damage: list[Damage] = field(default_factory=list)
    invalidated: list[tuple[str, str, str]] = field(default_factory=list)
    dead_trees: set[str] = field(default_factory=set)
    quarantined: list[Quarantined] = field(default_factory=list)

    @property
    def rate_bytes_s(self) -> float:
        return self.bytes_hashed / self.seconds if self.seconds > 0 else 0.0


class RateLimiter:
    """Keeps a pass to ``rate`` bytes per second (0: unlimited) and stops it when ``stop`` is set.

    Sleeps in the hashing loop's throttle hook; a wait on the stop event, so a shutdown is
    noticed within one chunk.
    """

    def __init__(self, rate: int, stop: threading.Event) -> None:
        self.rate = rate
        self.stop = stop
        self.start = time.monotonic()
        self.done = 0

    def __call__(self, nbytes: int) -> None:
        if self.stop.is_set():
            raise ScrubCancelled
        self.done += nbytes
        if self.rate <= 0:
            return
        ahead = self.start + self.done / self.rate - time.monotonic()
        if ahead > 0 and self.stop.wait(ahead):
            raise ScrubCancelled


def _variants_of_tree(store: _Parts, hexd: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((v.repo, v.commit, v.variant) for v in store.index.variants_of_tree(hexd))


def _damaged(report: VerifyReport) -> list[Problem]:
    return [p for p in report.problems if p.kind != "unknown"]


def _check_tree(store: _Parts, hexd: str) -> VerifyReport:
    """A full-speed check of one tree (the confirmation); empty when it is no longer live."""
    report = VerifyReport(log_problems=False)
    row = store.index.get_tree(hexd)
    if row is None or row.state != "live":
        return report
    verify_tree(
        store.layout,
        digest=hexd,
        manifest=row.manifest,
        owner_uid=store.owner_uid,
        report=report,
    )
    return report


def scrub_pass(
    store: _Parts,
    *,
    rate: int,
    stop: threading.Event,
    on_damage: Callable[[Damage], None] | None = None,
) -> ScrubReport:
    """One pass over the store (resuming an interrupted one); raises nothing for findings.

    ``on_damage`` is called once per confirmed problem before the damaged tree or blob is
    invalidated (the daemon logs and counts there). ScrubCancelled when ``stop`` is set; the
    cursor then records the last tree finished.
    """
    started = time.monotonic()
    out = ScrubReport()
    limiter = RateLimiter(rate, stop)
    cursor = store.meta.get(META_CURSOR) or ""
    digests = store.catalog.live_tree_digests()
    if cursor:
        out.resumed_after = cursor
        digests = [d for d in digests if d > cursor]
    hashed_inodes: dict[str, tuple[int, int]] = {}
    last_write = time.monotonic()
    done = cursor
    try:
        for hexd in digests:
            _check_stop(stop)
            row = store.index.get_tree(hexd)
            if row is not None and row.state == "live":  # else: collected since the pass began
                report = VerifyReport(log_problems=False)
                verify_tree(
                    store.layout,
                    digest=hexd,
                    manifest=row.manifest,
                    owner_uid=store.owner_uid,
                    report=report,
                    throttle=limiter,
                    hashed_inodes=hashed_inodes,
                )
                out.trees_checked += report.trees_checked
                out.bytes_hashed += report.bytes_hashed
                if _damaged(report):
                    _confirm_tree(store, hexd, out, on_damage)
            done = hexd
            if time.monotonic() - last_write > CURSOR_EVERY_S:
                store.meta.set(META_CURSOR, done)
                last_write = time.monotonic()
        done = TREES_DONE
        bad_blobs: list[str] = []
        for blob in store.index.blobs("live"):
            _check_stop(stop)
            report = VerifyReport(log_problems=False)
            ok = verify_blob(
                store.layout,
                blob.sha256,
                blob.size,
                owner_uid=store.owner_uid,
                report=report,
                throttle=limiter,
                known_inode=hashed_inodes.get(blob.sha256),
            )
            out.blobs_checked += report.blobs_checked
            out.bytes_hashed += report.bytes_hashed
            if ok is None and _damaged(report):
                bad_blobs.extend(_confirm_blob(store, blob.sha256, blob.size, out, on_damage))
        if bad_blobs:
            problems = [d.problem for d in out.damage]
            invalidated, dead, kept = store.repair.invalidate(blobs=bad_blobs, problems=problems)
            out.invalidated.extend(invalidated)
            out.dead_trees |= dead
            out.quarantined.extend(kept)
    except ScrubCancelled:
        if done:
            _save_cursor(store, done)
        raise
    finally:
        out.seconds = time.monotonic() - started
    out.completed = True
    store.meta.set(META_CURSOR, None)
    store.meta.set(META_LAST, repr(time.time()))
    return out


def check_tree_now(
    store: _Parts,
    digest: str,
    *,
    on_damage: Callable[[Damage], None] | None = None,
) -> ScrubReport:
    """Check one live tree at full speed, and take it out of service if it is damaged: what a
    pass does for one tree, for a tree someone reported (``ReportSuspect``) instead of waiting
    for the next pass. The finding is confirmed by a second check before anything changes, as
    in a pass (a transient read error, or GC removing the tree meanwhile, is no damage).
    Nothing is invalidated for a tree that is not live; the report then says so by checking
    nothing (``trees_checked`` 0)."""
    started = time.monotonic()
    out = ScrubReport()
    first = _check_tree(store, digest)
    out.trees_checked = first.trees_checked
    out.bytes_hashed = first.bytes_hashed
    if _damaged(first):
        _confirm_tree(store, digest, out, on_damage)
    out.seconds = time.monotonic() - started
    out.completed = True
    return out


def _check_stop(stop: threading.Event) -> None:
    if stop.is_set():
        raise ScrubCancelled


def _save_cursor(store: _Parts, value: str) -> None:
    try:
        store.meta.set(META_CURSOR, value)
    except Exception as exc:  # the store is closing: the next pass starts over, no harm
        log.debug("could not save the scrub cursor: %r", exc)


def _confirm_tree(
    store: _Parts,
    hexd: str,
    out: ScrubReport,
    on_damage: Callable[[Damage], None] | None,
) -> None:
    """Check a tree again at full speed; invalidate it if the damage is still there."""
    again = _check_tree(store, hexd)
    problems = _damaged(again)
    if not problems:
        return
    variants = _variants_of_tree(store, hexd)
    for problem in problems:
        damage = Damage(problem, variants)
        out.damage.append(damage)
        if on_damage is not None:
            on_damage(damage)
    # A damaged tree file may be a hard link of its blob: check the blobs it names, so a rotten
    # blob is not linked into the re-fetched tree.
    bad_blobs = []
    entries = {p.path: p for p in problems}
    for path, sha in store.index.tree_blobs(hexd):
        if str(store.layout.tree_path(hexd) / path) not in entries:
            continue
        blob = store.index.get_blob(sha)
        if blob is None or blob.state != "live":
            continue
        report = VerifyReport(log_problems=False)
        if verify_blob(store.layout, sha, blob.size, owner_uid=store.owner_uid, report=report):
            continue
        bad_blobs.append(sha)
        for problem in _damaged(report):
            damage = Damage(problem, variants)
            out.damage.append(damage)
            if on_damage is not None:
                on_damage(damage)
    found = problems + [d.problem for d in out.damage if d.problem.id in bad_blobs]
    invalidated, dead, kept = store.repair.invalidate(trees=[hexd], blobs=bad_blobs, problems=found)
    out.invalidated.extend(invalidated)
    out.dead_trees |= dead
    out.quarantined.extend(kept)


def _confirm_blob(
    store: _Parts,
    sha: str,
    size: int,
    out: ScrubReport,
    on_damage: Callable[[Damage], None] | None,
) -> list[str]:
    """Check a blob again at full speed; [sha] if it is still damaged."""
    report = VerifyReport(log_problems=False)
    if verify_blob(store.layout, sha, size, owner_uid=store.owner_uid, report=report):
        return []
    problems = _damaged(report)
    if not problems:
        return []
    trees = store.index.trees_of_blob(sha)
    variants = tuple(v for t in trees for v in _variants_of_tree(store, t))
    for problem in problems:
        damage = Damage(problem, variants)
        out.damage.append(damage)
        if on_damage is not None:
            on_damage(damage)
    return [sha]
