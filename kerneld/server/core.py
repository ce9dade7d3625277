"""The daemon's central object: it opens the store, builds the components, and holds them.

Both gRPC services, the Hub API and the background threads reach the daemon's state through one
`Core`: its config, the store, resolution over the upstream chain, leases, publisher trust and
the prefetcher, opened together (`open`) and closed together (`close`). The work itself lives
in the components it holds: `serving` (Resolve and leases with the daemon's policy),
`fetches` (the fetch history and metrics), `timer` (the scheduled prefetch), `scrubber` (the
background scrub); a reload's changes (`kerneld.server.reload`) are applied here, to each
component that holds the setting. `work()` counts the in-flight requests a shutdown drains.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from kerneld.config import Config
from kerneld.pipeline.acquire import Acquire
from kerneld.pipeline.fetch import Fetcher
from kerneld.pipeline.hardware import Hardware, detect
from kerneld.pipeline.prefetch import (
    ClientPlatforms,
    Emit,
    Prefetcher,
    PrefetchSummary,
    platforms_file,
)
from kerneld.pipeline.provenance import provenance_check
from kerneld.pipeline.publisher_trust import FILE_NAME as TRUST_FILE
from kerneld.pipeline.publisher_trust import NoHubUpstream, PublisherTrust
from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.pipeline.upstreams import TrackedUpstream, build_upstreams
from kerneld.server.plumbing import logs
from kerneld.server.plumbing.identity import FetchGate
from kerneld.server.plumbing.metrics import Metrics, StoreGauges
from kerneld.server.reload import config_change
from kerneld.server.services.fetch_history import FetchHistory
from kerneld.server.services.gate import DaemonGate
from kerneld.server.services.leases import LeaseBook
from kerneld.server.services.prefetch_timer import PrefetchTimer
from kerneld.server.services.refresh import RefRefresher
from kerneld.server.services.scrubber import Scrubber
from kerneld.server.services.serving import Serving
from kerneld.server.statuses import NotReady
from kerneld.store import (
    Capacity,
    Catalog,
    Collection,
    Policy,
    PublishedIndex,
    QuarantineArea,
    Repair,
    StoreHandle,
    open_store,
)
from kerneld.upstream.errors import UpstreamError
from kerneld_client.variants import PlatformFacts

log = logging.getLogger("kerneld.daemon")


def spec_for_entry(repo_id: str, version: int | None, revision: str | None) -> KernelSpec:
    return KernelSpec(repo_id, version=version, revision=revision)


class Core:
    """One daemon's state and components (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics,
        hardware_root: Path = Path("/"),
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.hardware_root = hardware_root
        self.started_at = time.time()
        self.ready = False
        self._store: StoreHandle | None = None
        self._resolver: Resolver | None = None
        self._acquire: Acquire | None = None
        self._fetcher: Fetcher | None = None
        self._leases: LeaseBook | None = None
        self._prefetcher: Prefetcher | None = None
        self._refresher: RefRefresher | None = None
        self._trust: PublisherTrust | None = None
        self.upstreams: list[TrackedUpstream] = []
        self.hardware: Hardware | None = None
        self.platforms = ClientPlatforms(None)
        self.fetches = FetchHistory(metrics)
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="resolve-many")
        self._inflight = 0
        self._idle = threading.Condition()
        self.cancel = threading.Event()
        """Set when the daemon stops: running prefetches end between variants."""
        self.serving = Serving(self)
        self.timer = PrefetchTimer(self)
        self.scrubber = Scrubber(self)
        self.fetch_gate = FetchGate()
        self.gate = DaemonGate(self)
        """The daemon's policy around the acquire path, and its front ends' fetch gate."""
        self.hub_api: list[str] = []
        """Where the Hub API endpoint listens (GetStatus shows it); set by the app."""
        self.listener_problems: list[str] = []
        """Optional listeners (Hub API, metrics) not served, and why (`kerneldctl status`)."""

    # ---- opening and closing -------------------------------------------------------------

    def open(self) -> StoreHandle:
        """Open (lock and scan) the store and build resolution over the upstream chain."""
        cfg = self.config
        upstreams = build_upstreams(cfg)
        self.platforms = ClientPlatforms(
            platforms_file(cfg.store_path), on_change=self._publish_picks
        )
        # Their picks, in the index it republishes.
        store = open_store(
            cfg, client_platforms=self.platforms.all(), provenance=provenance_check(cfg)
        )
        try:
            self.hardware = detect(self.hardware_root)
            # The one fetcher, driven by the acquire path only: every download passes its gate.
            fetcher = Fetcher(store, upstreams)
            resolver = Resolver(
                store,
                upstreams,
                ref_ttl_s=cfg.ref_ttl_s,
                negative_ttl_s=cfg.negative_ttl_s,
                fetch=fetcher,
            )
            acquire = Acquire(store, resolver, fetcher, self.gate)
            self._leases = LeaseBook(
                store.leases, per_client=cfg.lease_limit_per_client, total=cfg.lease_limit
            )
            store.gc.guard(self._leases.unwritten_trees)
            self._prefetcher = Prefetcher(
                store,
                resolver,
                acquire,
                hardware=self.host,
                client_platforms=self.platforms,
                configured_torch=_torch(cfg.prefetch_torch),
            )
            trust = PublisherTrust(
                cfg,
                self._ask_hub,
                lambda doc: store.published.publish_document(TRUST_FILE, doc),
                saved=store.published.read_document(TRUST_FILE),
            )
            trust.publish()
            self._refresher = RefRefresher(
                store,
                resolver,
                lambda specs, variants: self.prefetch(
                    specs, variants=variants, cancel=self.timer.cancel
                ),
                lambda outcome: self.metrics.ref_rechecks.labels(outcome).inc(),
                also=trust.recheck_due,
            )
        except BaseException:
            store.close()
            raise
        self.upstreams = upstreams
        self._trust = trust
        self._store = store
        self._resolver = resolver
        self._acquire = acquire
        self._fetcher = fetcher
        self.metrics.watch_store(self.gauges)
        return store

    def _publish_picks(self) -> None:
        """A client showed a new platform: publish its picks, so its next processes load
        without ranking variants. Off the RPC's thread: in a large store rewriting every
        repo's document takes a while (and jobs meanwhile rank for themselves)."""

        def publish() -> None:
            store = self._store
            if store is None:
                return
            try:  # the latest set: a burst of new platforms rewrites once
                store.published.set_platforms(self.platforms.all())
            except Exception as exc:  # jobs without a pick rank for themselves: nothing breaks
                log.warning("could not publish the picks of a new client platform: %r", exc)

        with contextlib.suppress(RuntimeError):  # the daemon is stopping
            self.pool.submit(publish)

    def close(self) -> None:
        self.stop_timer()
        self.scrubber.join(5.0)  # it ends at its next chunk; the store must outlive it
        if self._leases is not None:
            self._leases.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self._store is not None:
            self._store.close()

    # Gated on the store being open, not on `ready`: RPCs in flight when SIGTERM arrives must
    # finish (the servers stop accepting new ones themselves).
    @property
    def store(self) -> StoreHandle:
        if self._store is None:
            raise NotReady("kerneld is starting: the store is being opened and scanned")
        return self._store

    # The store's parts, each as the protocol its users need (the services take these, not the
    # store); gated like `store`.

    @property
    def names(self) -> Policy:
        return self.store.names

    @property
    def catalog(self) -> Catalog:
        return self.store.catalog

    @property
    def space(self) -> Capacity:
        return self.store.space

    @property
    def published(self) -> PublishedIndex:
        return self.store.published

    @property
    def collection(self) -> Collection:
        return self.store.gc

    @property
    def repair(self) -> Repair:
        return self.store.repair

    @property
    def quarantine(self) -> QuarantineArea:
        return self.store.quarantine

    def active_leases(self) -> int:
        """Leases recorded in the store that have not expired (flush first for the latest)."""
        now = time.time()
        return sum(1 for lease in self.store.leases.rows() if lease.expires_at > now)

    @property
    def acquire(self) -> Acquire:
        """The one path every front end takes to get a kernel (with `gate`, the policy)."""
        if self._acquire is None:
            raise NotReady("kerneld is starting: the store is being opened and scanned")
        return self._acquire

    @property
    def trust(self) -> PublisherTrust:
        if self._trust is None:
            raise NotReady("the store is not open yet")
        return self._trust

    def _ask_hub(self, org: str) -> bool:
        """The first Hub upstream's answer: is `org` a trusted kernel publisher?"""
        hubs = [u for u in self.upstreams if u.kind == "hub"]
        if not hubs:
            raise NoHubUpstream("no Hub upstream is configured")
        error: UpstreamError | None = None
        for hub in hubs:
            try:
                return hub.publisher_trusted(org)
            except UpstreamError as exc:
                error = exc
        assert error is not None
        raise error

    @property
    def resolver(self) -> Resolver:
        if self._resolver is None:
            raise NotReady("kerneld is starting: the store is being opened and scanned")
        return self._resolver

    def flush_leases(self) -> None:
        if self._leases is not None:
            self._leases.flush()

    @property
    def leases(self) -> LeaseBook:
        assert self._leases is not None
        return self._leases

    @property
    def prefetcher(self) -> Prefetcher:
        if self._prefetcher is None:
            raise NotReady("kerneld is starting: the store is being opened and scanned")
        return self._prefetcher

    def host(self) -> Hardware:
        if self.hardware is None:
            self.hardware = detect(self.hardware_root)
        return self.hardware

    def healthy(self) -> bool:
        """The watchdog probe: the index answers a query (a wedged store stops the pings)."""
        store = self._store
        if store is None:
            return True  # still starting; systemd's start timeout covers that phase
        store.meta.get("owner_uid")
        return True

    # ---- in-flight work (drained on SIGTERM) ---------------------------------------------

    @contextlib.contextmanager
    def work(self) -> Iterator[None]:
        with self._idle:
            self._inflight += 1
        try:
            yield
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=max(0.0, timeout))

    @property
    def inflight(self) -> int:
        return self._inflight

    # ---- status, prefetch ----------------------------------------------------------------

    def gauges(self) -> StoreGauges | None:
        store = self._store
        if store is None or not self.ready:
            return None
        self.flush_leases()
        usage = store.space.usage()
        active = self.active_leases()
        return StoreGauges(
            trees=usage.trees,
            blobs=usage.blobs,
            bytes_used=usage.bytes_used,
            cap_bytes=usage.cap_bytes or 0,
            active_leases=active,
            client_platforms=len(self.platforms.all()),
        )

    def configured_specs(self) -> list[KernelSpec]:
        return [spec_for_entry(p.repo_id, p.version, p.revision) for p in self.config.prefetch]

    def prefetch(
        self,
        specs: Sequence[KernelSpec],
        *,
        variants: Sequence[str] = (),
        torch_versions: Sequence[tuple[int, int]] = (),
        platforms: Sequence[PlatformFacts] = (),
        emit: Emit | None = None,
        cancel: threading.Event | None = None,
        quiet: bool = False,
    ) -> PrefetchSummary:
        prefetcher = self.prefetcher
        with self.work():
            summary = prefetcher.run(
                specs,
                variants=variants,
                torch_versions=torch_versions,
                platforms=platforms,
                emit=emit,
                cancel=cancel or self.cancel,
                quiet=quiet,
            )
        self.metrics.prefetches.labels("ok").inc(summary.kernels_ok)
        self.metrics.prefetches.labels("failed").inc(summary.kernels_failed)
        return summary

    def warm_upstreams(self) -> None:
        """Set the upstream clients up in the background, so the first cold Resolve after a
        start (or a reload that changed them) does not wait for it."""
        chain = list(self.upstreams)

        def warm() -> None:
            for upstream in chain:
                upstream.warm_up()

        threading.Thread(target=warm, name="upstream-warm-up", daemon=True).start()

    def start_timer(self) -> None:
        """Prefetch the configured kernels now (if `on_start`) and every `interval`; re-check
        every served ref once its TTL is up (`refresh`)."""
        self.timer.start()
        if self._refresher is not None:
            self._refresher.start()

    def wake_timer(self) -> None:
        self.timer.wake()
        if self._refresher is not None:
            self._refresher.wake()

    def stop_timer(self) -> None:
        """Stop scheduled prefetching and scrubbing: a prefetch in progress ends after its
        current variant, a scrub at its next chunk (background work does not hold up a
        shutdown like a client's request does)."""
        self.timer.stop()
        if self._refresher is not None:
            self._refresher.stop()
        self.scrubber.stop()

    # ---- reload --------------------------------------------------------------------------

    def apply_config(self, new: Config) -> tuple[list[str], list[str]]:
        """Switch to `new`; returns (changed and applied, changed but needing a restart)."""
        change = config_change(self.config, new)
        effective = change.effective
        if change.touches("upstreams", "fetch_attempts", "fetch_timeout_s"):
            self.upstreams = build_upstreams(effective)
            if self._fetcher is not None:  # later fetches use the new chain
                self._fetcher.upstreams = list(self.upstreams)
            self.warm_upstreams()
        if self._resolver is not None:
            self._resolver.reconfigure(
                self.upstreams,
                ref_ttl_s=effective.ref_ttl_s,
                negative_ttl_s=effective.negative_ttl_s,
            )
        if self._store is not None and change.touches(
            "cap_bytes", "min_free_bytes", "gc_min_age_s", "orphan_grace_s"
        ):
            self._store.gc.policy = replace(
                self._store.gc.policy,
                cap_bytes=effective.cap_bytes,
                min_free_bytes=effective.min_free_bytes,
                min_age_s=effective.gc_min_age_s,
                orphan_grace_s=effective.orphan_grace_s,
            )
        if self._store is not None:
            self._store.quarantine.max_bytes = effective.quarantine_max_bytes
            if change.touches(prefixes=("provenance_",)):
                self._store.signatures.install(provenance_check(effective))
        if self._trust is not None and change.touches(prefixes=("trust_",)):
            self._trust.reconfigure(effective)
        if self._prefetcher is not None:
            self._prefetcher.reconfigure(configured_torch=_torch(effective.prefetch_torch))
        if self._leases is not None:
            self._leases.reconfigure(
                per_client=effective.lease_limit_per_client, total=effective.lease_limit
            )
        if change.touches("log_level"):
            logs.set_level(effective.log_level)
        self.config = effective
        self.serving.forget()
        if change.touches("ref_ttl_s", prefixes=("prefetch",)):
            self.wake_timer()
        if change.touches(prefixes=("scrub",)):
            self.scrubber.wake()
        return change.applied, change.restart


def _torch(values: Sequence[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for text in values:
        major, minor = text.split(".")
        out.append((int(major), int(minor)))
    return tuple(out)
