"""The daemon's recent fetches (GetAdminStatus lists them) and the fetch metrics.

Every download the daemon makes, whoever asked for it (a Resolve, a prefetch, the scrubber's
re-fetch, the Hub API), is reported here once, as it ended: kept among the last
`KEEP` records and counted in `kerneld_fetches_total` / `kerneld_fetch_bytes_total`.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from kerneld.pipeline.fetch import FetchResult
from kerneld.server.plumbing.metrics import Metrics
from kerneld.store import IntegrityError
from kerneld.upstream.errors import EntryNotFound, RepoNotFound, RevisionNotFound

#: How many of the most recent fetches are kept.
KEEP = 64


@dataclass(frozen=True)
class FetchRecord:
    """One fetch as GetAdminStatus lists it: what, from where, how much; `error` if it failed."""

    repo: str
    commit: str
    variant: str
    upstream: str
    bytes: int
    seconds: float
    at: float
    error: str = ""


class FetchHistory:
    """The last `KEEP` fetches, oldest first; `record` also counts each in the metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._records: deque[FetchRecord] = deque(maxlen=KEEP)

    def __iter__(self) -> Iterator[FetchRecord]:
        return iter(self._records)

    def record(
        self,
        repo: str,
        commit: str,
        variant: str,
        result: FetchResult | None,
        error: BaseException | None,
    ) -> None:
        """One fetch that ended: with its `result`, or failed with `error` (an error that two
        layers report, the fetch and the resolution it was for, is counted once)."""
        if result is not None:
            self._records.append(
                FetchRecord(
                    repo,
                    commit,
                    variant,
                    result.upstream,
                    result.bytes_downloaded,
                    result.seconds,
                    time.time(),
                )
            )
            self.metrics.fetches.labels(result.upstream, "ok").inc()
            self.metrics.fetch_bytes.labels(result.upstream).inc(result.bytes_downloaded)
            return
        if getattr(error, "_fetch_recorded", False):
            return  # the fetch recorded it; the resolution it failed sees it again
        with contextlib.suppress(AttributeError):  # __slots__: counted each time it comes
            error._fetch_recorded = True  # type: ignore[union-attr]
        upstream = getattr(error, "upstream", "") or ""
        kind = (
            "integrity_error"
            if isinstance(error, IntegrityError)
            else "not_found"  # an answer about the repo, not a failing upstream
            if isinstance(error, RepoNotFound | RevisionNotFound | EntryNotFound)
            else "error"
        )
        if isinstance(error, IntegrityError):
            self.metrics.verify_failures.labels("download").inc()
        self.metrics.fetches.labels(upstream or "-", kind).inc()
        self._records.append(
            FetchRecord(repo, commit, variant, upstream, 0, 0.0, time.time(), str(error))
        )
