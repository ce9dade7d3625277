"""The daemon's shared state: config, store, resolution, leases, prefetch, fetch history.

Both gRPC services and the prefetch timer work through one `Core`, so policy (fetch allow-list,
lease limits), metrics and logging are applied the same way whoever asks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from kerneld.config import Config
from kerneld.fetch import Fetcher, FetchResult
from kerneld.hardware import Hardware, detect
from kerneld.prefetch import Cancelled, ClientPlatforms, Emit, Prefetcher, PrefetchSummary
from kerneld.provenance import provenance_check
from kerneld.resolve import (
    FetchNotAllowed,
    KernelSpec,
    NoVariantFits,
    Resolution,
    Resolver,
)
from kerneld.server import logs
from kerneld.server.errors import NotReady, RateLimited
from kerneld.server.identity import Caller, FetchGate, audit
from kerneld.server.leases import LeaseBook
from kerneld.server.metrics import Metrics, StoreGauges
from kerneld.server.refresh import RefRefresher
from kerneld.server.scrubber import Scrubber
from kerneld.server.trust import FILE_NAME as TRUST_FILE
from kerneld.server.trust import NoHubUpstream, PublisherTrust, UntrustedPublisher
from kerneld.server.upstreams import TrackedUpstream, build_upstreams
from kerneld.store import DeniedError, Hold, IntegrityError, Lease, Store
from kerneld.upstream.base import is_commit
from kerneld.upstream.errors import EntryNotFound, RepoNotFound, RevisionNotFound, UpstreamError
from kerneld_client.variants import Decision, PlatformFacts, decide

log = logging.getLogger("kerneld.daemon")

#: Config fields that only take effect at the next start.
RESTART_FIELDS: tuple[str, ...] = (
    "store_path",
    "user_socket",
    "admin_socket",
    "metrics_socket",
    "metrics_socket_mode",
    "metrics_socket_group",
    "metrics_listen",
    "hub_api_listen",
    "hub_api_socket",
    "threads",
    "max_connections",
    "admin_max_connections",
    "idle_timeout_s",
    "max_concurrent_rpcs",
    "system",
)


@dataclass(frozen=True)
class FetchRecord:
    repo: str
    commit: str
    variant: str
    upstream: str
    bytes: int
    seconds: float
    at: float
    error: str = ""


@dataclass(frozen=True)
class Served:
    """A Resolve answer: the resolution and a lease per tree (the kernel's and its deps').
    `memo` lives as long as the remembered resolution: the service keeps its wire form there."""

    resolution: Resolution
    leases: dict[str, Lease]
    memo: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class _Hit:
    resolution: Resolution
    generation: int
    until: float
    trees: tuple[str, ...]
    memo: dict[str, object]


#: Remembered resolutions (distinct kernel x platform x selector combinations).
HIT_CACHE_SIZE = 4096


def _walk(res: Resolution) -> Iterator[Resolution]:
    yield res
    for dep in res.dependencies:
        yield from _walk(dep)


def spec_for_entry(repo_id: str, version: int | None, revision: str | None) -> KernelSpec:
    return KernelSpec(repo_id, version=version, revision=revision)


class Core:
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
        self._store: Store | None = None
        self._resolver: Resolver | None = None
        self._leases: LeaseBook | None = None
        self._prefetcher: Prefetcher | None = None
        self._refresher: RefRefresher | None = None
        self._trust: PublisherTrust | None = None
        self.upstreams: list[TrackedUpstream] = []
        self.hardware: Hardware | None = None
        self.platforms = ClientPlatforms(None)
        self.fetches: deque[FetchRecord] = deque(maxlen=64)
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="resolve-many")
        self._inflight = 0
        self._idle = threading.Condition()
        self._timer_stop = threading.Event()
        self._timer_wake = threading.Event()
        self._timer_cancel = threading.Event()
        self._timer: threading.Thread | None = None
        self._hits: OrderedDict[tuple[object, ...], _Hit] = OrderedDict()
        self._hits_lock = threading.Lock()
        self.cancel = threading.Event()
        """Set when the daemon stops: running prefetches end between variants."""
        self.scrubber = Scrubber(self)
        self.fetch_gate = FetchGate()
        self.hub_api: list[str] = []
        """Where the Hub API endpoint listens (GetStatus shows it); set by the app."""

    # ---- opening and closing -------------------------------------------------------------

    def open(self) -> Store:
        """Open (lock and scan) the store and build resolution over the upstream chain."""
        cfg = self.config
        upstreams = build_upstreams(cfg)
        store = Store.open(
            cfg.store_path,
            cap_bytes=cfg.cap_bytes,
            min_free_bytes=cfg.min_free_bytes,
            min_age_s=cfg.gc_min_age_s,
            orphan_grace_s=cfg.orphan_grace_s,
        )
        store.quarantine_max_bytes = cfg.quarantine_max_bytes
        store.set_provenance(provenance_check(cfg))
        if not cfg.system:
            store.mark_as_cache()  # ~/.cache/kerneld/store: backups skip it
        try:
            self.hardware = detect(self.hardware_root)
            self.platforms = ClientPlatforms(cfg.store_path / "daemon" / "platforms.json")
            fetcher = Fetcher(store, upstreams)
            resolver = Resolver(
                store,
                upstreams,
                ref_ttl_s=cfg.ref_ttl_s,
                negative_ttl_s=cfg.negative_ttl_s,
                fetcher=fetcher,
            )
            self._leases = LeaseBook(
                store, per_client=cfg.lease_limit_per_client, total=cfg.lease_limit
            )
            store.guard_from_gc(self._leases.unwritten_trees)
            self._prefetcher = Prefetcher(
                store,
                resolver,
                hardware=self.host,
                client_platforms=self.platforms,
                on_fetch=self.record_fetch,
                configured_torch=_torch(cfg.prefetch_torch),
            )
            trust = PublisherTrust(
                cfg,
                self._ask_hub,
                lambda doc: store.publish_document(TRUST_FILE, doc),
                saved=store.read_document(TRUST_FILE),
            )
            trust.publish()
            self._refresher = RefRefresher(
                store,
                resolver,
                lambda specs, variants: self.prefetch(
                    specs, variants=variants, cancel=self._timer_cancel
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
        self.metrics.watch_store(self.gauges)
        return store

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
    def store(self) -> Store:
        if self._store is None:
            raise NotReady("kerneld is starting: the store is being opened and scanned")
        return self._store

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
        store.get_meta("owner_uid")
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

    # ---- resolution ----------------------------------------------------------------------

    def lease_ttl(self, requested_s: float) -> float:
        return min(float(requested_s) or self.config.lease_ttl_s, self.config.lease_max_s)

    def _generation(self, store: Store) -> int:
        """The store's change counter (in memory: this daemon is the store's only writer)."""
        return store.generation

    def _fresh_until(self, store: Store, res: Resolution) -> float:
        """Until when every ref in `res` (and its dependencies) is within its TTL."""
        until = float("inf")
        for r in _walk(res):
            if r.spec.locked_commit is not None or is_commit(r.spec.ref):
                continue
            row = store.get_ref(r.spec.repo_id, r.spec.ref)
            if row is None:
                return 0.0
            until = min(until, row.fetched_at + self.config.ref_ttl_s)
        return until

    def resolve(
        self,
        spec: KernelSpec,
        facts: PlatformFacts,
        *,
        allow_fetch: bool,
        variant: str = "",
        lease_s: float = 0,
        holder: str = "",
        caller: Caller | None = None,
        trust_remote_code: bool = False,
    ) -> Served:
        """Resolve with the daemon's policy: the fetch allow-list, leases, metrics, logs;
        for a `caller` (None: the daemon itself) also `[fetch] allow_groups` and its rate limit.

        Warm path: an answer computed before is reused while the store's generation is
        unchanged and its refs are within their TTL; it costs one indexed read and no write
        (leases and resolve times are written behind by the LeaseBook).
        """
        store = self.store
        hit = self.resolve_remembered(
            spec,
            facts,
            allow_fetch=allow_fetch,
            variant=variant,
            lease_s=lease_s,
            holder=holder,
            trust_remote_code=trust_remote_code,
        )
        if hit is not None:
            return hit
        try:
            self.trust.check(spec.repo_id, trust_remote_code=trust_remote_code)
        except UntrustedPublisher:
            self.metrics.resolves.labels("untrusted").inc()
            raise
        allow = allow_fetch and self.config.fetch_allowed(spec.repo_id)
        key = (spec, facts, variant, allow)
        generation = self._generation(store)
        # The hold keeps every tree the answer names from GC until its leases are granted.
        with self.work(), store.holds.hold() as hold:
            try:
                res, cacheable = self._gated(caller, spec, facts, allow, variant, holder, hold)
            except FetchNotAllowed as exc:
                # Without allow_fetch this is the answer a cold client expects ("not here yet,
                # ask again with a fetch"), not a failure; with it, a policy refused the fetch.
                self.metrics.resolves.labels("refused" if allow_fetch else "not_cached").inc()
                if allow_fetch and not allow:
                    raise FetchNotAllowed(
                        "not in this host's store, and the fetch policy ([fetch] allow) does not "
                        "let clients download this kernel",
                        repo_id=spec.repo_id,
                        revision=exc.revision or spec.ref,
                    ) from exc
                raise
            except Exception as exc:
                self.metrics.resolves.labels(_outcome(exc)).inc()
                if isinstance(exc, IntegrityError | UpstreamError):
                    self.record_fetch(
                        spec.repo_id, getattr(exc, "revision", "") or spec.ref, "", None, exc
                    )
                raise
            for r in _walk(res):  # dependencies are code the job runs too
                if r is not res:
                    try:
                        self.trust.check(r.spec.repo_id, trust_remote_code=trust_remote_code)
                    except UntrustedPublisher as exc:
                        self.metrics.resolves.labels("untrusted").inc()
                        raise UntrustedPublisher(
                            f"dependency {r.spec.repo_id} of {spec.repo_id}: {exc.message}",
                            repo_id=spec.repo_id,
                            hint=exc.hint,
                        ) from exc
            memo: dict[str, object] = {}
            if not res.stale and cacheable:
                until = self._fresh_until(store, res)
                trees = tuple(dict.fromkeys(r.hit.digest for r in _walk(res)))
                with self._hits_lock:
                    self._hits[key] = _Hit(res, generation, until, trees, memo)
                    self._hits.move_to_end(key)
                    while len(self._hits) > HIT_CACHE_SIZE:
                        self._hits.popitem(last=False)
            for r in _walk(res):
                if r.fetched is not None:
                    self.record_fetch(r.spec.repo_id, r.commit, r.variant, r.fetched, None)
            return self._served(res, memo, lease_s, holder, spec)

    def resolve_remembered(
        self,
        spec: KernelSpec,
        facts: PlatformFacts,
        *,
        allow_fetch: bool,
        variant: str = "",
        lease_s: float = 0,
        holder: str = "",
        trust_remote_code: bool = False,
    ) -> Served | None:
        """The warm path of `resolve` alone: an answer computed before, while the store's
        generation is unchanged and its refs are within their TTL; None otherwise. Never does
        I/O beyond one indexed read, so callers may run it where they cannot wait."""
        self.platforms.record(facts)
        allow = allow_fetch and self.config.fetch_allowed(spec.repo_id)
        key = (spec, facts, variant, allow)
        generation = self._generation(self.store)
        with self._hits_lock:
            entry = self._hits.get(key)
        if entry is None or entry.generation != generation or time.time() >= entry.until:
            return None
        trust = self.trust
        if not all(
            trust.known(r.spec.repo_id, trust_remote_code=trust_remote_code)
            for r in _walk(entry.resolution)
        ):
            return None  # `resolve` checks (and may ask the Hub)
        for tree in entry.trees:
            self.leases.resolved(tree)
        return self._served(entry.resolution, entry.memo, lease_s, holder, spec)

    def _gated(
        self,
        caller: Caller | None,
        spec: KernelSpec,
        facts: PlatformFacts,
        allow: bool,
        variant: str,
        holder: str,
        hold: Hold,
    ) -> tuple[Resolution, bool]:
        """(resolution, may be remembered for everyone). A caller's Resolve is fetch-triggering
        when the store alone cannot give the answer a fetch would (a ref unknown or past its
        TTL, a variant or dependency missing, a commit never listed upstream); only those pass
        `[fetch] allow_groups` and the caller's rate limit, each with one audit line. A refused
        caller still gets what is cached, if anything fits."""
        resolver = self.resolver

        def run(fetch: bool) -> Resolution:
            return resolver.resolve(
                spec, facts, allow_fetch=fetch, variant=variant or None, holder=holder, hold=hold
            )

        if caller is None or not allow:
            return run(allow), True
        local: Resolution | None = None
        with contextlib.suppress(FetchNotAllowed, NoVariantFits):
            local = run(False)
        if local is not None and self._complete(local, variant):
            return local, True
        cfg = self.config
        what = f"repo={spec.repo_id} ref={spec.ref}"
        try:
            allowed = cfg.fetch_allow_gids()
            if not self.fetch_gate.may_fetch(caller, allowed):
                raise FetchNotAllowed(
                    "not in this host's store, and the fetch policy ([fetch] allow_groups = "
                    f"{list(cfg.fetch_allow_groups)}) lets only members of those groups download; "
                    f"the caller ({caller}) is not one",
                    repo_id=spec.repo_id,
                    revision=spec.ref,
                )
            self.fetch_gate.take(
                caller,
                per_minute=cfg.fetch_per_uid_rate,
                burst=cfg.fetch_per_uid_burst,
                what=f"{spec.repo_id}@{spec.ref}/{variant}",
            )
        except (FetchNotAllowed, RateLimited) as exc:
            served = "; served the cached build" if local is not None else ""
            audit(caller, "Resolve", what, f"fetch refused ({type(exc).__name__}){served}")
            if local is not None:
                return local, False
            raise
        audit(caller, "Resolve", what, "fetch allowed")
        return run(True), True

    def _complete(self, res: Resolution, variant: str) -> bool:
        """Is a no-fetch answer the one a fetch would give (fresh refs, the best variant of
        every kernel here, every commit's upstream listing known)?"""
        store = self.store
        for r in _walk(res):
            if r.stale or store.upstream_variants(r.spec.repo_id, r.commit) is None:
                return False
            best = next((d.variant for d in r.decisions if d.accepted), None)
            if r.variant != (variant if r is res and variant else best):
                return False
        return True

    def _served(
        self,
        res: Resolution,
        memo: dict[str, object],
        lease_s: float,
        holder: str,
        spec: KernelSpec,
    ) -> Served:
        ttl = self.lease_ttl(lease_s)
        leases: dict[str, Lease] = {}
        for r in _walk(res):
            if r.hit.digest not in leases:
                leases[r.hit.digest] = self.leases.grant(r.hit.digest, ttl, holder)
        self.metrics.leases.inc(len(leases))
        self.metrics.resolves.labels("miss" if res.fetched is not None else "hit").inc()
        if res.stale:
            self.metrics.stale.inc()
        level = logging.INFO if res.fetched is not None or res.stale else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(
                level,
                "resolve repo=%s ref=%s commit=%s variant=%s %s%s client=%s",
                spec.repo_id,
                spec.ref,
                res.commit,
                res.variant,
                "miss (fetched)" if res.fetched is not None else "hit",
                " stale" if res.stale else "",
                holder or "-",
            )
        return Served(res, leases, memo)

    def forget_hits(self) -> None:
        """Drop every remembered answer (config reload: TTLs and policy may have changed)."""
        with self._hits_lock:
            self._hits.clear()

    def cached_variants(self, repo: str, commit: str) -> set[str]:
        return set(self.store.variants(repo, commit))

    def list_variants(
        self,
        spec: KernelSpec,
        facts: PlatformFacts,
        *,
        allow_fetch: bool,
        caller: Caller | None = None,
    ) -> tuple[str, bool, list[Decision]]:
        store, resolver = self.store, self.resolver
        allow = allow_fetch and self.config.fetch_allowed(spec.repo_id)
        if allow and caller is not None:  # asks upstreams, downloads nothing: groups only
            allow = self.fetch_gate.may_fetch(caller, self.config.fetch_allow_gids())
        store.check_denied(spec.repo_id, spec.ref)
        commit, stale = resolver.commit_for(spec, allow_network=allow)
        store.check_denied(spec.repo_id, spec.ref, commit)
        names = resolver.variant_names(spec.repo_id, commit, allow_network=allow)
        return commit, stale, decide(names, facts)

    def renew_lease(self, lease_id: str, seconds: float) -> Lease:
        self.leases.flush()
        return self.store.renew_lease(lease_id, self.lease_ttl(seconds))

    def release_lease(self, lease_id: str) -> bool:
        self.leases.flush()
        return self.store.release_lease(lease_id)

    # ---- fetch history and metrics -------------------------------------------------------

    def record_fetch(
        self,
        repo: str,
        commit: str,
        variant: str,
        result: FetchResult | None,
        error: BaseException | None,
    ) -> None:
        if result is not None:
            self.fetches.append(
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
        self.fetches.append(
            FetchRecord(repo, commit, variant, upstream, 0, 0.0, time.time(), str(error))
        )

    def gauges(self) -> StoreGauges | None:
        store = self._store
        if store is None or not self.ready:
            return None
        self.flush_leases()
        usage = store.usage()
        now = time.time()
        active = sum(1 for lease in store.leases() if lease.expires_at > now)
        return StoreGauges(
            trees=usage.trees,
            blobs=usage.blobs,
            bytes_used=usage.bytes_used,
            cap_bytes=usage.cap_bytes or 0,
            active_leases=active,
            client_platforms=len(self.platforms.all()),
        )

    # ---- prefetch ------------------------------------------------------------------------

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
        self._timer = threading.Thread(target=self._timer_loop, name="prefetch-timer", daemon=True)
        self._timer.start()
        if self._refresher is not None:
            self._refresher.start()

    def wake_timer(self) -> None:
        self._timer_wake.set()
        if self._refresher is not None:
            self._refresher.wake()

    def stop_timer(self) -> None:
        """Stop scheduled prefetching and scrubbing: a prefetch in progress ends after its
        current variant, a scrub at its next chunk (background work does not hold up a
        shutdown like a client's request does)."""
        self._timer_stop.set()
        self._timer_cancel.set()
        self._timer_wake.set()
        if self._refresher is not None:
            self._refresher.stop()
        self.scrubber.stop()

    def _timer_loop(self) -> None:
        first = True
        while not self._timer_stop.is_set():
            if not first or self.config.prefetch_on_start:
                specs = self.configured_specs()
                if specs:
                    try:
                        summary = self.prefetch(specs, cancel=self._timer_cancel)
                        log.info(
                            "scheduled prefetch done: %d kernels ok, %d failed, %d variants "
                            "fetched, %d already present",
                            summary.kernels_ok,
                            summary.kernels_failed,
                            summary.variants_fetched,
                            summary.variants_present,
                        )
                    except Cancelled:
                        return
                    except NotReady:
                        return
                    except Exception as exc:  # never let the timer die
                        log.error("scheduled prefetch failed: %r", exc, exc_info=exc)
            first = False
            self._timer_wake.wait(self.config.prefetch_interval_s)
            self._timer_wake.clear()

    # ---- reload --------------------------------------------------------------------------

    def apply_config(self, new: Config) -> tuple[list[str], list[str]]:
        """Switch to `new`; returns (changed and applied, changed but needing a restart)."""
        old = self.config
        changed = [f.name for f in fields(Config) if getattr(old, f.name) != getattr(new, f.name)]
        changed = [c for c in changed if c != "source"]
        restart = [c for c in changed if c in RESTART_FIELDS]
        applied = [c for c in changed if c not in RESTART_FIELDS]
        keep = {name: getattr(old, name) for name in restart}
        effective = replace(new, **keep)
        if any(c in applied for c in ("upstreams", "fetch_attempts", "fetch_timeout_s")):
            chain = build_upstreams(effective)
            if self._resolver is not None:
                self._resolver.upstreams = list(chain)
                self._resolver.fetcher.upstreams = list(chain)
            self.upstreams = chain
            self.warm_upstreams()
        if self._resolver is not None:
            self._resolver.ref_ttl_s = effective.ref_ttl_s
            self._resolver.negative_ttl_s = effective.negative_ttl_s
        if self._store is not None and any(
            c in applied for c in ("cap_bytes", "min_free_bytes", "gc_min_age_s", "orphan_grace_s")
        ):
            self._store.policy = replace(
                self._store.policy,
                cap_bytes=effective.cap_bytes,
                min_free_bytes=effective.min_free_bytes,
                min_age_s=effective.gc_min_age_s,
                orphan_grace_s=effective.orphan_grace_s,
            )
        if self._store is not None:
            self._store.quarantine_max_bytes = effective.quarantine_max_bytes
            if any(c.startswith("provenance_") for c in applied):
                self._store.set_provenance(provenance_check(effective))
        if self._trust is not None and any(c.startswith("trust_") for c in applied):
            self._trust.reconfigure(effective)
        if self._prefetcher is not None:
            self._prefetcher.configured_torch = _torch(effective.prefetch_torch)
        if self._leases is not None:
            self._leases.per_client = effective.lease_limit_per_client
            self._leases.total = effective.lease_limit
        if "log_level" in applied:
            logs.set_level(effective.log_level)
        self.config = effective
        self.forget_hits()
        if any(c.startswith("prefetch") or c == "ref_ttl_s" for c in applied):
            self.wake_timer()
        if any(c.startswith("scrub") for c in applied):
            self.scrubber.wake()
        return applied, restart


def _outcome(exc: BaseException) -> str:
    """`kerneld_resolves_total`'s result for a failed Resolve: what the caller asked for does
    not exist (not_found, no_variant), or something failed (error, the one to alert on)."""
    if isinstance(exc, RepoNotFound | RevisionNotFound | EntryNotFound):
        return "not_found"
    if isinstance(exc, NoVariantFits):
        return "no_variant"
    if isinstance(exc, DeniedError):
        return "denied"
    return "error"


def _torch(values: Sequence[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for text in values:
        major, minor = text.split(".")
        out.append((int(major), int(minor)))
    return tuple(out)
