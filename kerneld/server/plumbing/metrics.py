"""Prometheus metrics: the daemon's counters, gauges and the store collector (the registry).

The HTTP exposition that serves them (`[metrics]`) is a front end of its own,
`kerneld/server/fronts/metrics_endpoint.py`; here is only what every layer bumps.

Counters are bumped where the event happens; store sizes and lease counts are read at scrape
time (a collector), so an idle daemon does no metrics work at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily


@dataclass(frozen=True)
class StoreGauges:
    trees: int
    blobs: int
    bytes_used: int
    cap_bytes: int
    active_leases: int
    client_platforms: int


class _StoreCollector:
    """Reads store gauges at scrape time."""

    def __init__(self, read: Callable[[], StoreGauges | None]) -> None:
        self.read = read

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        gauges = self.read()
        if gauges is None:
            return
        for name, doc, value in (
            ("kerneld_store_trees", "Published variant trees", gauges.trees),
            ("kerneld_store_blobs", "Content blobs", gauges.blobs),
            ("kerneld_store_bytes", "Bytes the store occupies", gauges.bytes_used),
            ("kerneld_store_cap_bytes", "Configured size cap (0: none)", gauges.cap_bytes),
            ("kerneld_active_leases", "Leases that have not expired", gauges.active_leases),
            (
                "kerneld_client_platforms",
                "Distinct platforms clients have shown",
                gauges.client_platforms,
            ),
        ):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            yield family


class Metrics:
    """Every metric the daemon exports, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.resolves = Counter(
            "kerneld_resolves",
            "Resolve outcomes: hit, miss (fetched), not_cached (asked without a fetch: the "
            "client asks again with one), refused (fetch policy), untrusted (publisher "
            "trust), not_found, no_variant, denied; error is the one to alert on",
            ["result"],
            registry=r,
        )
        self.errors = Counter(
            "kerneld_rpc_errors",
            "Failed RPCs by method and ErrorCode",
            ["method", "code"],
            registry=r,
        )
        self.fetches = Counter(
            "kerneld_fetches",
            "Variant downloads by upstream and result",
            ["upstream", "result"],
            registry=r,
        )
        self.fetch_bytes = Counter(
            "kerneld_fetch_bytes", "Bytes downloaded from upstreams", ["upstream"], registry=r
        )
        self.verify_failures = Counter(
            "kerneld_verify_failures",
            "Problems found by verification and integrity failures of downloads",
            ["kind"],
            registry=r,
        )
        self.gc_freed = Counter("kerneld_gc_freed_bytes", "Bytes freed by GC", registry=r)
        self.gc_runs = Counter("kerneld_gc_runs", "GC runs", ["dry_run"], registry=r)
        self.leases = Counter("kerneld_leases_granted", "Leases granted", registry=r)
        self.stale = Counter(
            "kerneld_stale_serves",
            "Resolves answered with a ref past its TTL because every upstream failed to "
            "re-check it (a ref merely due is re-checked in the background, not counted)",
            registry=r,
        )
        self.ref_rechecks = Counter(
            "kerneld_ref_rechecks",
            "Background re-checks of refs past their TTL, by outcome: unchanged, moved (the "
            "new commit fetched and the index moved), failed (upstreams down: stale), gone",
            ["outcome"],
            registry=r,
        )
        self.hub_api_requests = Counter(
            "kerneld_hub_api_requests",
            "Requests to the Hub-compatible HTTP endpoint by route (info, refs, tree, "
            "paths_info, file, org_overview, other) and HTTP status",
            ["route", "status"],
            registry=r,
        )
        self.prefetches = Counter(
            "kerneld_prefetch_kernels", "Prefetched kernels by result", ["result"], registry=r
        )
        self.ready = Gauge("kerneld_ready", "1 when serving", registry=r)
        self.scrub_runs = Counter(
            "kerneld_scrub_runs",
            "Background scrub passes by outcome (completed, cancelled, failed)",
            ["result"],
            registry=r,
        )
        self.scrub_bytes = Counter(
            "kerneld_scrub_bytes", "Bytes re-hashed by the background scrub", registry=r
        )
        self.scrub_trees = Counter(
            "kerneld_scrub_trees", "Trees re-hashed by the background scrub", registry=r
        )
        self.scrub_problems = Counter(
            "kerneld_scrub_problems",
            "Damage the scrub confirmed, by kind (corrupt, missing, untrusted, io)",
            ["kind"],
            registry=r,
        )
        self.scrub_invalidated = Counter(
            "kerneld_scrub_invalidated_trees",
            "Trees the scrub took out of service",
            registry=r,
        )
        self.scrub_refetches = Counter(
            "kerneld_scrub_refetches",
            "Re-fetches of variants whose tree the scrub invalidated (ok, failed, skipped)",
            ["result"],
            registry=r,
        )
        self.scrub_last_completed = Gauge(
            "kerneld_scrub_last_completed_timestamp_seconds",
            "Unix time the last complete scrub pass ended (0: none since start)",
            registry=r,
        )
        self.suspect_reports = Counter(
            "kerneld_suspect_reports",
            "ReportSuspect calls by outcome (intact, damaged, unknown: the daemon's own verdict; "
            "rate_limited, invalid, error: refused)",
            ["verdict"],
            registry=r,
        )
        self.quarantine_entries = Gauge(
            "kerneld_quarantine_entries",
            "Entries in the store's quarantine (damaged objects kept, not deleted)",
            registry=r,
        )
        self.quarantine_bytes = Gauge(
            "kerneld_quarantine_bytes", "Bytes the quarantine's entries hold", registry=r
        )
        self.quarantine_max_bytes = Gauge(
            "kerneld_quarantine_max_bytes",
            "The quarantine's bound, [store] quarantine_max (0: none)",
            registry=r,
        )
        self._collector: _StoreCollector | None = None

    def watch_store(self, read: Callable[[], StoreGauges | None]) -> None:
        if self._collector is None:
            self._collector = _StoreCollector(read)
            self.registry.register(self._collector)

    def watch_quarantine(self, read: Callable[[], tuple[int, int, int]]) -> None:
        """Read (entries, bytes, bound) of the quarantine at scrape time; a store that cannot
        be read (closing) shows 0 rather than failing the whole scrape."""

        def part(i: int) -> Callable[[], float]:
            def value() -> float:
                try:
                    return float(read()[i])
                except Exception:
                    return 0.0

            return value

        self.quarantine_entries.set_function(part(0))
        self.quarantine_bytes.set_function(part(1))
        self.quarantine_max_bytes.set_function(part(2))
