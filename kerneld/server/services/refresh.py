"""Ref freshness: every ref the store serves is re-asked of the upstreams once its TTL is up.

Jobs load warm from the published index without calling the daemon, so nothing on their path
ever notices that a kernel author moved `v1` to a new build. The refresher does it for them,
in the background: it wakes when the oldest ref's TTL ends, asks the upstreams where the ref
points now, and

- unchanged: records the answer's time (the ref is fresh again; one request per ref per TTL);
- moved: fetches, for the new commit, the variants the store holds for the old one (or what
  `auto` picks when the author renamed them) with their dependencies, and only then moves the
  ref, which republishes the index: a job that starts after that loads the new build warm;
- failed (every upstream down): keeps the old commit, which is then *stale* (served, counted
  in `kerneld_stale_serves_total`, flagged in Resolve answers) and asked again after
  `RETRY_S`. An outage is one warning line (its first failed re-check) and one info line when
  a re-check succeeds again, not a line per ref per `RETRY_S`.

An import-only daemon (no upstream: `upstream = []`) re-checks nothing: the last
`kerneldctl mirror import` is the authority for its refs, until the next one.

So a job started more than `ref_ttl` + one upstream round trip + the fetch after a push loads
the new commit (docs/configuration.md, `[resolve] ref_ttl`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kerneld.pipeline.prefetch import Cancelled, PrefetchSummary
from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.server.services.background import BackgroundThread
from kerneld.server.statuses import NotReady
from kerneld.store import RefRow, ResolveTarget

log = logging.getLogger("kerneld.refresh")

RETRY_S = 30.0
"""After a failed re-check, the ref is asked again this much later (or after its TTL, if
shorter): an outage is not hammered, a recovery is noticed within half a minute."""

IDLE_S = 300.0
"""The longest sleep, whatever the TTL."""


Prefetch = Callable[[Sequence[KernelSpec], Sequence[str]], PrefetchSummary]
"""Fetch these specs with these variant modes/names (the daemon's `prefetch`, bound)."""


class RefRefresher(BackgroundThread):
    """The background re-check of refs past their TTL (one thread, one ref at a time)."""

    name = "ref-refresher"
    stop_on = (Cancelled, NotReady)  # the daemon is stopping

    def __init__(
        self,
        store: ResolveTarget,
        resolver: Resolver,
        prefetch: Prefetch,
        count: Callable[[str], None],
        *,
        also: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.store = store
        self.resolver = resolver
        self.prefetch = prefetch
        self.count = count
        """Called with each re-check's outcome (the `kerneld_ref_rechecks_total` counter)."""
        self.also = also
        """Other re-checks of what jobs use without asking (publisher trust); seconds until
        the next is due."""
        self.clock = clock
        self._retry_at: dict[tuple[str, str], float] = {}
        self._outage: tuple[float, int] | None = None
        """(when the first re-check of this outage failed, failures since); None: no outage."""

    # ---- lifecycle -----------------------------------------------------------------------

    def stop(self) -> None:
        super().stop()
        self.join(timeout=10)

    def turn(self) -> float:
        wait = self.run_due()
        if self.also is not None:
            wait = min(wait, self.also())
        return max(0.05, wait)

    def failed(self, exc: Exception) -> float:
        log.error("ref refresh failed: %r", exc, exc_info=exc)
        return RETRY_S

    # ---- one pass ------------------------------------------------------------------------

    def run_due(self) -> float:
        """Re-check every ref that is due; seconds until the next one is."""
        now = self.clock()
        due, next_at = self.due(now)
        for row in due:
            if self.stopping:
                break
            self.refresh(row)
        if due:
            _, next_at = self.due(self.clock())
        return next_at - self.clock()

    def due(self, now: float) -> tuple[list[RefRow], float]:
        """(refs past their TTL whose commit the store serves, when the next one will be)."""
        ttl = self.resolver.ref_ttl_s
        due: list[RefRow] = []
        if not self.resolver.upstreams:
            return due, now + IDLE_S  # import-only: imported refs stand until the next import
        # A ref recorded after this pass is due a TTL after it was: looking again within a TTL
        # finds it in time (nothing needs to wake the refresher when a ref is set).
        next_at = now + min(IDLE_S, ttl)
        for row in self.store.names.all_refs():
            if not self.store.catalog.variants(row.repo, row.commit):
                continue  # nothing of it is served: no job uses this ref from the store
            at = max(row.fetched_at + ttl, self._retry_at.get((row.repo, row.ref), 0.0))
            if at <= now:
                due.append(row)
            else:
                next_at = min(next_at, at)
        return due, next_at

    def refresh(self, row: RefRow) -> str:
        """Re-check one ref; the outcome: unchanged, moved, failed or gone."""
        key = (row.repo, row.ref)
        spec = KernelSpec(row.repo, revision=row.ref)
        asked_at = self.clock()
        try:
            commit, stale = self.resolver.commit_for(spec, refresh=True, record=False)
        except Exception as exc:  # gone upstream (RevisionNotFound, RepoNotFound), denied, ...
            return self._failed(key, row, "gone", exc)
        if stale:
            return self._failed(key, row, "failed", "every upstream failed; serving it stale")
        if commit == row.commit:
            self.store.names.set_ref(row.repo, row.ref, commit, fetched_at=asked_at)
            self._retry_at.pop(key, None)
            self._answered()
            self.count("unchanged")
            return "unchanged"
        wanted = self._variants_for(row, commit)
        summary = self.prefetch([KernelSpec(row.repo, revision=commit)], wanted)
        if summary.kernels_failed:
            _, error = summary.errors[0]
            return self._failed(key, row, "failed", f"fetching {commit} failed: {error}")
        self.store.names.set_ref(row.repo, row.ref, commit, fetched_at=asked_at)
        self._retry_at.pop(key, None)
        self._answered()
        self.count("moved")
        log.info(
            "ref moved repo=%s ref=%s from=%s to=%s variants=%s; jobs load the new commit now",
            row.repo,
            row.ref,
            row.commit,
            commit,
            ",".join(wanted),
        )
        return "moved"

    def _variants_for(self, row: RefRow, commit: str) -> list[str]:
        """The variants jobs use for the old commit that the new one has, else `auto`."""
        try:
            names = set(self.resolver.variant_names(row.repo, commit))
        except Exception:
            return ["auto"]
        kept = [v for v in self.store.catalog.variants(row.repo, row.commit) if v in names]
        return kept or ["auto"]

    def _failed(self, key: tuple[str, str], row: RefRow, outcome: str, why: object) -> str:
        retry = min(RETRY_S, self.resolver.ref_ttl_s)
        self._retry_at[key] = self.clock() + retry
        self.count(outcome)
        first = True
        if outcome == "failed":  # an outage: one warning for all its refs and retries
            first = self._outage is None
            since, failures = self._outage or (self.clock(), 0)
            self._outage = (since, failures + 1)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "ref re-check %s repo=%s ref=%s commit=%s: %s; jobs keep this commit, asked again "
            "in %.0fs%s",
            outcome,
            row.repo,
            row.ref,
            row.commit,
            why,
            retry,
            "; further failed re-checks of this outage are logged at debug level only"
            if outcome == "failed"
            else "",
        )
        return outcome

    def _answered(self) -> None:
        """A re-check got an answer: an outage, if one was logged, is over (one line)."""
        outage, self._outage = self._outage, None
        if outage is not None:
            since, failures = outage
            log.info(
                "ref re-checks answered again after %.0fs (%d failed re-checks during the outage)",
                self.clock() - since,
                failures,
            )
