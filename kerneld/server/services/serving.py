"""Resolve, ListVariants and leases over gRPC, and the answers the daemon remembers.

Getting a kernel is the acquire path's (`kerneld.pipeline.acquire`: denies, refs, listings,
publisher trust, the fetch), with the daemon's gate (`gate.py`: bounds, trust, the fetch gate
and its audit line, the fetch history), the same for every front end; what is here is the
RPC's own: the local-first answer for a caller the fetch gate refuses, leases and
their limits, metrics and log lines. An answer computed before is remembered and reused while
the store's generation is unchanged and its refs are within their TTL: the warm path costs one
indexed read and no write.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.acquire import Acquire
from kerneld.pipeline.plans import Best
from kerneld.pipeline.prefetch import ClientPlatforms
from kerneld.pipeline.publisher_trust import PublisherTrust, UntrustedPublisher
from kerneld.pipeline.request import FetchNotAllowed, KernelSpec, NoVariantFits, Resolution
from kerneld.server.plumbing.identity import Caller, audit
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.services.fetch_history import FetchHistory
from kerneld.server.services.gate import DaemonGate
from kerneld.server.services.leases import LeaseBook
from kerneld.server.statuses import RateLimited
from kerneld.store import DeniedError, Hold, IntegrityError, Lease, ServingView
from kerneld.upstream.errors import EntryNotFound, RepoNotFound, RevisionNotFound, UpstreamError
from kerneld_client.variants import Decision, PlatformFacts, decide
from kerneld_client.vocabulary import is_commit

log = logging.getLogger("kerneld.daemon")


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


class ServingHost(Protocol):
    """What serving needs of the daemon (kerneld.server.core.Core implements it): its settings
    and metrics, the components it opened, the acquire path and the daemon's gate, the fetch
    history, and the in-flight work count that a shutdown drains."""

    @property
    def config(self) -> Config: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def store(self) -> ServingView: ...

    @property
    def trust(self) -> PublisherTrust: ...

    @property
    def leases(self) -> LeaseBook: ...

    @property
    def platforms(self) -> ClientPlatforms: ...

    @property
    def acquire(self) -> Acquire: ...

    @property
    def gate(self) -> DaemonGate: ...

    @property
    def fetches(self) -> FetchHistory: ...

    def work(self) -> AbstractContextManager[None]: ...


class Serving:
    """The daemon's answers to Resolve, ListVariants and lease calls."""

    def __init__(self, core: ServingHost) -> None:
        self.core = core
        self._hits: OrderedDict[tuple[object, ...], _Hit] = OrderedDict()
        self._hits_lock = threading.Lock()

    def lease_ttl(self, requested_s: float) -> float:
        return min(float(requested_s) or self.core.config.lease_ttl_s, self.core.config.lease_max_s)

    def _generation(self, store: ServingView) -> int:
        """The store's change counter (in memory: this daemon is the store's only writer)."""
        return store.published.generation

    def _fresh_until(self, store: ServingView, res: Resolution) -> float:
        """Until when every ref in `res` (and its dependencies) is within its TTL."""
        until = float("inf")
        for r in _walk(res):
            if r.spec.locked_commit is not None or is_commit(r.spec.ref):
                continue
            row = store.names.get_ref(r.spec.repo_id, r.spec.ref)
            if row is None:
                return 0.0
            until = min(until, row.fetched_at + self.core.config.ref_ttl_s)
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
        remembered: bool = True,
    ) -> Served:
        """Resolve with the daemon's policy: the fetch allow-list, leases, metrics, logs;
        for a `caller` (None: the daemon itself) also `[fetch] allow_groups` and its rate limit.
        `remembered=False`: the caller has just looked for a remembered answer itself.

        Warm path: an answer computed before is reused while the store's generation is
        unchanged and its refs are within their TTL; it costs one indexed read and no write
        (leases and resolve times are written behind by the LeaseBook).
        """
        store = self.core.store
        hit = (
            None
            if not remembered
            else self.resolve_remembered(
                spec,
                facts,
                allow_fetch=allow_fetch,
                variant=variant,
                lease_s=lease_s,
                holder=holder,
                trust_remote_code=trust_remote_code,
            )
        )
        if hit is not None:
            return hit
        allow = allow_fetch and self.core.config.fetch_allowed(spec.repo_id)
        key = (spec, facts, variant, allow)
        generation = self._generation(store)
        # The hold keeps every tree the answer names from GC until its leases are granted.
        with self.core.work(), store.holds.hold() as hold:
            try:
                res, cacheable = self._gated(
                    caller, spec, facts, allow, variant, holder, hold, trust_remote_code
                )
            except FetchNotAllowed as exc:
                # Without allow_fetch this is the answer a cold client expects ("not here yet,
                # ask again with a fetch"), not a failure; with it, a policy refused the fetch.
                self.core.metrics.resolves.labels("refused" if allow_fetch else "not_cached").inc()
                if allow_fetch and not allow:
                    raise FetchNotAllowed(
                        "not in this host's store, and the fetch policy ([fetch] allow) does not "
                        "let clients download this kernel",
                        repo_id=spec.repo_id,
                        revision=exc.revision or spec.ref,
                    ) from exc
                raise
            except Exception as exc:
                self.core.metrics.resolves.labels(_outcome(exc)).inc()
                if isinstance(exc, IntegrityError | UpstreamError):
                    self.core.fetches.record(
                        spec.repo_id, getattr(exc, "revision", "") or spec.ref, "", None, exc
                    )
                raise
            memo: dict[str, object] = {}
            if not res.stale and cacheable:
                until = self._fresh_until(store, res)
                trees = tuple(dict.fromkeys(r.hit.digest for r in _walk(res)))
                with self._hits_lock:
                    self._hits[key] = _Hit(res, generation, until, trees, memo)
                    self._hits.move_to_end(key)
                    while len(self._hits) > HIT_CACHE_SIZE:
                        self._hits.popitem(last=False)
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
        self.core.platforms.record(facts)
        allow = allow_fetch and self.core.config.fetch_allowed(spec.repo_id)
        key = (spec, facts, variant, allow)
        generation = self._generation(self.core.store)
        with self._hits_lock:
            entry = self._hits.get(key)
        if entry is None or entry.generation != generation or time.time() >= entry.until:
            return None
        trust = self.core.trust
        if not all(
            trust.known(r.spec.repo_id, trust_remote_code=trust_remote_code)
            for r in _walk(entry.resolution)
        ):
            return None  # `resolve` checks (and may ask the Hub)
        for tree in entry.trees:
            self.core.leases.resolved(tree)
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
        trust_remote_code: bool,
    ) -> tuple[Resolution, bool]:
        """(resolution, may be remembered for everyone). A caller's Resolve is fetch-triggering
        when the store alone cannot give the answer a fetch would (a ref unknown or past its
        TTL, a variant or dependency missing, a commit never listed upstream); only those pass
        the daemon's fetch gate (`[fetch] allow_groups`, the caller's budget, one audit
        line). A refused caller still gets what is cached, if anything fits."""
        acquire = self.core.acquire

        def run(fetch: bool) -> Resolution:
            return acquire.acquire(
                spec,
                Best(facts, variant or None),
                allow_fetch=fetch,
                holder=holder,
                hold=hold,
                trust_remote_code=trust_remote_code,
            )

        if caller is None or not allow:
            return run(allow), True
        local: Resolution | None = None
        with contextlib.suppress(FetchNotAllowed, NoVariantFits):
            local = run(False)
        if local is not None and self._complete(local, variant):
            return local, True
        what = f"repo={spec.repo_id} ref={spec.ref}"
        try:
            self.core.gate.open_network(caller, spec.repo_id, what, "Resolve")
        except (FetchNotAllowed, RateLimited) as exc:
            if local is not None:
                audit(caller, "Resolve", what, f"served the cached build ({type(exc).__name__})")
                return local, False
            raise
        return run(True), True

    def _complete(self, res: Resolution, variant: str) -> bool:
        """Is a no-fetch answer the one a fetch would give (fresh refs, the best variant of
        every kernel here, every commit's upstream listing known)?"""
        store = self.core.store
        for r in _walk(res):
            if r.stale or store.names.upstream_variants(r.spec.repo_id, r.commit) is None:
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
                leases[r.hit.digest] = self.core.leases.grant(r.hit.digest, ttl, holder)
        self.core.metrics.leases.inc(len(leases))
        self.core.metrics.resolves.labels("miss" if res.fetched is not None else "hit").inc()
        if res.stale:
            self.core.metrics.stale.inc()
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

    def forget(self) -> None:
        """Drop every remembered answer (config reload: TTLs and policy may have changed)."""
        with self._hits_lock:
            self._hits.clear()

    def cached_variants(self, repo: str, commit: str) -> set[str]:
        return set(self.core.store.catalog.variants(repo, commit))

    def list_variants(
        self,
        spec: KernelSpec,
        facts: PlatformFacts,
        *,
        allow_fetch: bool,
        caller: Caller | None = None,
    ) -> tuple[str, bool, list[Decision]]:
        # asks upstreams, downloads nothing: the groups only, not the budget
        allow = allow_fetch and self.core.gate.may_fetch(caller, spec.repo_id)
        listing = self.core.acquire.listing(spec, allow_network=allow)
        return listing.commit, listing.stale, decide(listing.names, facts)

    def renew_lease(self, lease_id: str, seconds: float) -> Lease:
        self.core.leases.flush()
        return self.core.store.leases.renew(lease_id, self.lease_ttl(seconds))

    def release_lease(self, lease_id: str) -> bool:
        self.core.leases.flush()
        return self.core.store.leases.release(lease_id)


def _outcome(exc: BaseException) -> str:
    """`kerneld_resolves_total`'s result for a failed Resolve: what the caller asked for does
    not exist (not_found, no_variant), or something failed (error, the one to alert on)."""
    if isinstance(exc, RepoNotFound | RevisionNotFound | EntryNotFound):
        return "not_found"
    if isinstance(exc, NoVariantFits):
        return "no_variant"
    if isinstance(exc, DeniedError):
        return "denied"
    if isinstance(exc, UntrustedPublisher):
        return "untrusted"
    return "error"
