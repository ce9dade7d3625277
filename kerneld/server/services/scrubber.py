"""The daemon's background scrub: when to run it, what to log and count, and the re-fetch.

The pass itself (rate-limited re-hash, confirmation, invalidation) is
:func:`kerneld.store.scrub.scrub_pass`. This thread runs it every ``[store] scrub_interval``
after the end of the last complete pass (the time is kept in the store, so a daemon that
restarts daily still scrubs weekly; an interrupted pass resumes at the next start), logs one
line per confirmed problem and per re-fetch, counts everything in ``kerneld_scrub_*`` metrics,
and fetches every invalidated variant again from the upstreams (unless it is denied by now),
so the host heals without an admin. Damaged objects are quarantined, never deleted: once their
variants are served again the quarantined copy is dropped; what no upstream could replace stays
in the quarantine and is logged with where it is and how to restore or drop it. Serving never
waits for it: it holds no store lock while hashing and runs in its own thread.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.acquire import Acquire
from kerneld.pipeline.plans import Named
from kerneld.pipeline.request import KernelSpec
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.services.background import BackgroundThread
from kerneld.store import DeniedError, Hold, ScrubTarget
from kerneld.store.scrub import META_CURSOR, META_LAST, Damage, ScrubCancelled, ScrubReport

log = logging.getLogger("kerneld.scrub")

#: The longest the thread sleeps before looking at the clock and the config again.
MAX_SLEEP_S = 3600.0


class ScrubHost(Protocol):
    """What the scrub needs of the daemon (kerneld.server.core.Core implements it): its
    settings, store and metrics, the acquire path for re-fetches (its gate records them), and
    the in-flight work count that a shutdown drains."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> ScrubTarget: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def acquire(self) -> Acquire: ...

    def work(self) -> AbstractContextManager[None]: ...


class Scrubber(BackgroundThread):
    """The scrub thread of one daemon; `stop()` asks a running pass to end at its next chunk
    (its cursor is saved, and the next start resumes there)."""

    name = "scrub"
    stop_on = (ScrubCancelled,)

    def __init__(self, core: ScrubHost) -> None:
        super().__init__()
        self.core = core
        self.last_report: ScrubReport | None = None

    # ---- scheduling ----------------------------------------------------------------------

    def due_in(self) -> float | None:
        """Seconds until the next pass (0: now), None when scrubbing is off."""
        interval = self.core.config.scrub_interval_s
        if interval <= 0:
            return None
        store = self.core.store
        if store.meta.get(META_CURSOR):
            return 0.0  # a pass was cut short: finish it
        last = store.meta.get(META_LAST) or store.meta.get("created_at")
        since = float(last) if last else time.time()
        return max(0.0, since + interval - time.time())

    def turn(self) -> float:
        try:
            wait = self.due_in()
        except Exception as exc:  # the store is closing, or its index is unreadable
            log.error("scrub: cannot read the schedule: %r", exc)
            return MAX_SLEEP_S
        if wait is None or wait > 0:
            return MAX_SLEEP_S if wait is None else min(wait, MAX_SLEEP_S)
        self.run_once()
        return 0.0  # the schedule says when the next pass is

    def failed(self, exc: Exception) -> float:
        """A pass failed: try again next interval."""
        self.core.metrics.scrub_runs.labels("failed").inc()
        log.error("scrub: pass failed: %r", exc, exc_info=exc)
        return min(self.core.config.scrub_interval_s or MAX_SLEEP_S, 600.0)

    # ---- one pass ------------------------------------------------------------------------

    def run_once(self) -> ScrubReport:
        """Scrub the store now, then re-fetch what it invalidated; returns the report."""
        store = self.core.store
        metrics = self.core.metrics
        rate = self.core.config.scrub_rate_bytes
        log.info(
            "scrub: pass started rate=%s",
            f"{rate / (1 << 20):.1f}MiB/s" if rate else "unlimited",
        )
        try:
            report = store.scrub.run_pass(rate=rate, stop=self._stop, on_damage=self.record_damage)
        except ScrubCancelled:
            metrics.scrub_runs.labels("cancelled").inc()
            log.info("scrub: pass cancelled (the daemon is stopping); it resumes at the next start")
            raise
        metrics.scrub_runs.labels("completed").inc()
        metrics.scrub_bytes.inc(report.bytes_hashed)
        metrics.scrub_trees.inc(report.trees_checked)
        metrics.scrub_invalidated.inc(len(report.dead_trees))
        metrics.scrub_last_completed.set(time.time())
        refetched = self.heal(report)
        log.info(
            "scrub: pass completed trees=%d blobs=%d bytes=%d seconds=%.2f rate=%.1fMiB/s "
            "damaged=%d invalidated_trees=%d refetched=%d/%d%s",
            report.trees_checked,
            report.blobs_checked,
            report.bytes_hashed,
            report.seconds,
            report.rate_bytes_s / (1 << 20),
            len(report.damage),
            len(report.dead_trees),
            refetched,
            len(report.invalidated),
            f" resumed_after={report.resumed_after}" if report.resumed_after else "",
        )
        self.last_report = report
        return report

    def heal(self, report: ScrubReport) -> int:
        """Re-fetch what `report` invalidated, then drop the quarantined copies the re-fetch
        replaced; how many variants came back. The re-fetched variants are held until the
        quarantine is settled: evicted in between, they would look never replaced and their
        damaged copies would stay."""
        with self.core.store.holds.hold() as hold:
            refetched = self._refetch(report, hold)
            self._settle_quarantine(report)
        return refetched

    def _settle_quarantine(self, report: ScrubReport) -> None:
        """Drop quarantined copies that the re-fetch replaced; log what stays, and why."""
        if not report.quarantined:
            return
        store = self.core.store
        dropped = {q.name for q in store.quarantine.prune()}
        for q in report.quarantined:
            if q.name in dropped:
                log.info("scrub: %s was re-fetched; its quarantined copy is dropped", q.name)
            else:
                log.error(
                    "scrub: no upstream could replace it, kept: %s; the daemon must be "
                    "stopped for --restore/--drop",
                    q.describe(),
                )

    def record_damage(self, damage: Damage) -> None:
        """Count and log one damaged object, whoever found it (a scrub pass, a job's report)."""
        p = damage.problem
        self.core.metrics.scrub_problems.labels(p.kind).inc()
        used_by = " ".join(f"repo={r} commit={c} variant={v}" for r, c, v in damage.variants)
        log.error(
            "scrub: %s %s %s at %s: %s; %s",
            p.kind,
            p.object,
            p.id,
            p.path,
            p.detail,
            used_by or "used by no variant",
        )

    def _refetch(self, report: ScrubReport, hold: Hold) -> int:
        """Fetch every invalidated variant again, through the acquire path (held, and refused
        when the commit or any ref naming it is denied by now); how many came back."""
        ok = 0
        metrics = self.core.metrics
        acquire, store = self.core.acquire, self.core.store
        for repo, commit, variant in dict.fromkeys(report.invalidated):
            try:
                got = acquire.acquire(
                    KernelSpec(repo, locked_commit=commit),
                    Named(variant, store.catalog.lookup, every_ref=True),
                    hold=hold,
                )
            except DeniedError as exc:
                metrics.scrub_refetches.labels("skipped").inc()
                log.warning(
                    "scrub: not re-fetching repo=%s commit=%s variant=%s: denied (%s)",
                    repo,
                    commit,
                    variant,
                    exc,
                )
                continue
            except Exception as exc:
                metrics.scrub_refetches.labels("failed").inc()
                log.warning(
                    "scrub: re-fetch failed repo=%s commit=%s variant=%s error=%s; clients fall "
                    "back until it is fetched again",
                    repo,
                    commit,
                    variant,
                    exc,
                )
                continue
            ok += 1
            metrics.scrub_refetches.labels("ok").inc()
            result = got.fetched
            log.info(
                "scrub: re-fetched repo=%s commit=%s variant=%s upstream=%s bytes=%d tree=%s",
                repo,
                commit,
                variant,
                result.upstream if result else "-",
                result.bytes_downloaded if result else 0,
                got.found.digest,
            )
        return ok
