"""Refs and listings: a request's revision -> its commit -> the variants that commit has.

Revision -> commit: a ref cache with a TTL, served stale when every upstream is down, and a
short negative cache; commit -> variant names: cached forever (commits are immutable). What
comes after (the variant chosen, the tree looked up or fetched, `kernel-depends`) is the
acquire path's (`kerneld.pipeline.acquire`), which asks these two questions through the
`Listings` protocol; `Resolver.resolve` runs that path for store tools, without a policy.
The request's words (`KernelSpec`, `Resolution`, the resolution errors) are
`kerneld.pipeline.request`'s, re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kerneld.errors import ErrorKind, WireCode
from kerneld.pipeline.acquire import Acquire, dependencies_of
from kerneld.pipeline.fetch import Fetcher, VariantFetcher
from kerneld.pipeline.fetch_progress import FetchProgressFn
from kerneld.pipeline.plans import Best
from kerneld.pipeline.request import (
    DependencyCycle,
    FetchNotAllowed,
    KernelSpec,
    NoVariantFits,
    Resolution,
    ResolveError,
)
from kerneld.store import Hold, LookupHit, ResolveTarget
from kerneld.upstream.base import Upstream
from kerneld.upstream.errors import (
    RepoNotFound,
    RevisionNotFound,
    UpstreamError,
    UpstreamUnavailable,
    every_upstream,
)
from kerneld_client.single_flight import SingleFlight
from kerneld_client.variants import PlatformFacts
from kerneld_client.vocabulary import is_commit

__all__ = [
    "LISTING_RETRY_S",
    "DependencyCycle",
    "FetchNotAllowed",
    "KernelSpec",
    "NoVariantFits",
    "Resolution",
    "ResolveError",
    "Resolver",
]

log = logging.getLogger("kerneld.resolve")

LISTING_RETRY_S = 30.0
"""After every upstream failed to list a commit's variants (or a ref could not be re-checked),
they are not asked again for this long: during an outage each job is answered from what is
here, instead of costing every upstream its retries again (a restarted daemon has no answers
of its own yet)."""


class _VersionMissing(Exception):
    """An upstream listed the repo's versions and the one asked for is not among them."""

    kind = ErrorKind.NOT_FOUND
    wire_code: WireCode = "REVISION_NOT_FOUND"

    def __init__(self, error: RevisionNotFound, versions: set[int]) -> None:
        super().__init__(str(error))
        self.error = error
        self.versions = versions


def _version_not_found(repo_id: str, version: int, listed: set[int]) -> RevisionNotFound:
    """`kernels`' verdict for a missing version, with the versions the upstreams listed."""
    return RevisionNotFound(
        f"Version {version} not found, available versions: "
        + ", ".join(str(v) for v in sorted(listed)),
        repo_id=repo_id,
        revision=f"v{version}",
    )


class Resolver:
    """Resolution over one store and an ordered upstream chain."""

    def __init__(
        self,
        store: ResolveTarget,
        upstreams: Sequence[Upstream],
        *,
        ref_ttl_s: float = 300.0,
        negative_ttl_s: float = 30.0,
        fetch: VariantFetcher | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`fetch` downloads a variant the store lacks for `resolve` (default: a plain `Fetcher`
        over the same upstreams); the daemon's fetches go through its own `Acquire`."""
        self.store = store
        self.upstreams = list(upstreams)
        self.ref_ttl_s = ref_ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._fetch = fetch or Fetcher(store, self.upstreams)
        self.clock = clock
        self._ref_flight: SingleFlight[tuple[str, str, bool, bool, bool], tuple[str, bool]] = (
            SingleFlight()
        )
        self._failing: dict[tuple[str, str], float] = {}
        """(repo, ref) -> when every upstream last failed to answer for it; cleared by the next
        answer. Only these refs are served *stale*: a ref merely past its TTL is being
        re-checked in the background (`kerneld.server.services.refresh`), which is not a failure."""
        self._outage_since: float | None = None
        """When the first stale ref of the current outage was served (None: no outage)."""
        self._variants_flight: SingleFlight[tuple[str, str, bool], list[str]] = SingleFlight()
        self._unlisted: dict[tuple[str, str], tuple[float, UpstreamError]] = {}
        """(repo, commit) -> when and how every upstream last failed to list its variants."""

    def reconfigure(
        self, upstreams: Sequence[Upstream], *, ref_ttl_s: float, negative_ttl_s: float
    ) -> None:
        """A reload's new upstream chain and TTLs (the fetcher's chain is set by its owner)."""
        self.upstreams = list(upstreams)
        self.ref_ttl_s = ref_ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._unlisted.clear()

    # -- refs ----------------------------------------------------------------------------------

    def commit_for(
        self,
        spec: KernelSpec,
        *,
        allow_network: bool = True,
        refresh: bool = False,
        record: bool = True,
    ) -> tuple[str, bool]:
        """(commit, stale); concurrent callers asking for the same ref share one lookup.

        `record=False` asks without moving the recorded ref: the caller moves it (`set_ref`)
        once the new commit's trees are in the store, so the published index never names a
        commit that jobs would have to download first."""
        result = self._ref_flight.do(
            (spec.repo_id, spec.ref, allow_network, refresh, record),
            lambda: self._commit_for(
                spec, allow_network=allow_network, refresh=refresh, record=record
            ),
        )
        return result

    def answers_locally(self, spec: KernelSpec) -> bool:
        """Would `commit_for` answer without asking an upstream (a commit, or a ref within its
        TTL)? A front end asks before it charges a caller for a question upstream."""
        if spec.locked_commit is not None or is_commit(spec.ref):
            return True
        row = self.store.names.get_ref(spec.repo_id, spec.ref)
        return row is not None and self.clock() - row.fetched_at < self.ref_ttl_s

    def lists_locally(self, repo_id: str, commit: str) -> bool:
        """Would `variant_names` answer without asking an upstream?"""
        return self.store.names.upstream_variants(repo_id, commit) is not None

    def _recovered(self, upstream: str) -> None:
        """An upstream answered: end the outage, with one line if one was logged."""
        since, self._outage_since = self._outage_since, None
        if since is not None:
            log.info(
                "upstreams answer again (upstream=%s) after %.0fs; refs are fresh again as "
                "they are re-checked",
                upstream,
                self.clock() - since,
            )

    def failing(self, repo_id: str, ref: str) -> bool:
        """Did every upstream fail the last time `ref` was asked for (served stale since)?"""
        return (repo_id, ref) in self._failing

    def _commit_for(
        self, spec: KernelSpec, *, allow_network: bool, refresh: bool, record: bool
    ) -> tuple[str, bool]:
        """(commit, stale). Commits need no lookup; refs are cached for `ref_ttl_s`.

        `refresh` asks the upstreams even within the TTL (prefetch: a moved `vN` branch is
        fetched before clients need it); the cached commit is still served if all are down.
        Without the network a ref past its TTL is answered from the store: stale only if the
        upstreams failed the last time they were asked.
        """
        if spec.locked_commit is not None:
            return spec.locked_commit, False
        ref = spec.ref
        if is_commit(ref):
            return ref, False
        row = self.store.names.get_ref(spec.repo_id, ref)
        if row is not None and not self.upstreams:
            # Import-only: the last `mirror import` is the authority; nothing to re-ask.
            return row.commit, False
        fresh = row is not None and not refresh and self.clock() - row.fetched_at < self.ref_ttl_s
        if row is not None and (fresh or not allow_network):
            return row.commit, not fresh and self.failing(spec.repo_id, ref)
        failed_at = self._failing.get((spec.repo_id, ref))
        recently_failed = failed_at is not None and self.clock() - failed_at < LISTING_RETRY_S
        if row is not None and recently_failed and not refresh:
            return row.commit, True  # asked moments ago, in vain: not again yet
        negative = self.store.names.get_negative(spec.repo_id, ref)
        if negative is not None and row is None:
            cls = RepoNotFound if negative.reason.startswith("repo:") else RevisionNotFound
            raise cls(
                f"{negative.reason.split(':', 1)[-1]} (cached)",
                repo_id=spec.repo_id,
                revision=ref,
            )
        if not self.upstreams:
            raise UpstreamUnavailable(
                "not in the store, and this host is import-only (no upstream): bring it with "
                "`kerneldctl mirror import`",
                repo_id=spec.repo_id,
                revision=ref,
            )
        if not allow_network:
            raise FetchNotAllowed(
                "revision not known to this host and fetching is not allowed",
                repo_id=spec.repo_id,
                revision=ref,
            )
        failures: list[UpstreamError] = []
        listed: set[int] | None = None  # versions the upstreams listed, if any listing worked
        for upstream in self.upstreams:
            try:
                if spec.version is None:
                    commit = upstream.resolve_revision(spec.repo_id, ref)
                    versions: list[int] | None = None
                else:
                    commit, versions = self._version_commit(upstream, spec.repo_id, spec.version)
            except _VersionMissing as exc:
                listed = (listed or set()) | exc.versions
                failures.append(exc.error)
                continue
            except (RepoNotFound, RevisionNotFound, UpstreamUnavailable) as exc:
                failures.append(exc)
                continue
            except UpstreamError as exc:
                log.warning(
                    "bad ref answer upstream=%s repo=%s ref=%s error=%s",
                    upstream.name,
                    spec.repo_id,
                    ref,
                    exc,
                )
                failures.append(exc)
                continue
            self._failing.pop((spec.repo_id, ref), None)
            self._recovered(upstream.name)
            if record:
                self.store.names.set_ref(
                    spec.repo_id, ref, commit, fetched_at=self.clock(), versions=versions
                )
            return commit, False
        # A malformed answer (a corrupted or cut body) says nothing about the ref either way:
        # like an outage, it must neither be cached as "not found" nor hide the known commit.
        unavailable = [f for f in failures if not isinstance(f, RevisionNotFound | RepoNotFound)]
        if row is not None and unavailable:
            self._failing[(spec.repo_id, ref)] = self.clock()
            # Once per outage (and once on recovery): every ref served stale every 30 s for as
            # long as the upstreams are down would bury the journal.
            first = self._outage_since is None
            if first:
                self._outage_since = self.clock()
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "serving stale ref repo=%s ref=%s commit=%s age=%.0fs reason=%s; other refs "
                "served stale during this outage are logged at debug level only",
                spec.repo_id,
                ref,
                row.commit,
                self.clock() - row.fetched_at,
                unavailable[0],
            )
            return row.commit, True
        if not failures:
            raise UpstreamUnavailable("no upstream configured", repo_id=spec.repo_id, revision=ref)
        ctx = {"repo_id": spec.repo_id, "revision": ref}
        if unavailable:
            raise every_upstream(failures, unavailable[0], **ctx)
        if all(isinstance(f, RepoNotFound) for f in failures):
            self.store.names.put_negative(
                spec.repo_id, ref, "", "repo:" + failures[0].message, self.negative_ttl_s
            )
            raise every_upstream(failures, failures[0], **ctx)
        not_found = next(f for f in failures if isinstance(f, RevisionNotFound | RepoNotFound))
        if (
            spec.version is not None
            and isinstance(not_found, RevisionNotFound)
            and listed is not None
        ):
            not_found = _version_not_found(spec.repo_id, spec.version, listed)
            failures = [not_found]
        self.store.names.put_negative(
            spec.repo_id, ref, "", "rev:" + not_found.message, self.negative_ttl_s
        )
        raise every_upstream(failures, not_found, **ctx)

    def _version_commit(
        self, upstream: Upstream, repo_id: str, version: int
    ) -> tuple[str, list[int]]:
        """(commit of branch `v<version>`, every version the upstream has), from one refs
        listing: the list is what a client needs for `kernels`' "version N is available"."""
        versions = upstream.list_refs(repo_id).versions()
        commit = versions.get(version)
        if commit is None:
            missing = RevisionNotFound(
                f"no branch v{version}",
                upstream=upstream.name,
                repo_id=repo_id,
                revision=f"v{version}",
            )
            raise _VersionMissing(missing, set(versions))
        return commit, sorted(versions)

    # -- variants ------------------------------------------------------------------------------

    def variant_names(self, repo_id: str, commit: str, *, allow_network: bool = True) -> list[str]:
        """Every variant of a commit, as the upstream lists it (cached forever).

        Concurrent callers share one listing.
        """
        result = self._variants_flight.do(
            (repo_id, commit, allow_network),
            lambda: self._variant_names(repo_id, commit, allow_network=allow_network),
        )
        return result

    def _variant_names(self, repo_id: str, commit: str, *, allow_network: bool) -> list[str]:
        names = self.store.names.upstream_variants(repo_id, commit)
        if names is not None:
            return names
        published = self.store.catalog.variants(repo_id, commit)
        if not self.upstreams:  # import-only: what imports published is all there is
            if not published:
                raise UpstreamUnavailable(
                    "no variant of this commit is in the store, and this host is import-only "
                    "(no upstream): bring it with `kerneldctl mirror import`",
                    repo_id=repo_id,
                    revision=commit,
                )
            return published
        if not allow_network:
            if not published:
                raise FetchNotAllowed(
                    "no variant of this commit is on this host and fetching is not allowed",
                    repo_id=repo_id,
                    revision=commit,
                )
            return published
        unlisted = self._unlisted.get((repo_id, commit))
        if unlisted is not None and self.clock() - unlisted[0] < LISTING_RETRY_S:
            if published:
                return published
            raise unlisted[1]
        failures: list[UpstreamError] = []
        for upstream in self.upstreams:
            try:
                names = upstream.list_variants(repo_id, commit)
            except UpstreamError as exc:
                failures.append(exc)
                continue
            self._unlisted.pop((repo_id, commit), None)
            self.store.names.set_upstream_variants(repo_id, commit, names)
            return names
        if not failures:
            raise UpstreamUnavailable("no upstream configured", repo_id=repo_id, revision=commit)
        error = every_upstream(failures, failures[0], repo_id=repo_id, revision=commit)
        if len(self._unlisted) >= 4096:  # bounded: the oldest failures are the least useful
            self._unlisted.pop(next(iter(self._unlisted)))
        self._unlisted[(repo_id, commit)] = (self.clock(), error)
        if published:
            return published
        raise error

    # -- resolve ------------------------------------------------------------------------------

    def resolve(
        self,
        spec: KernelSpec,
        facts: PlatformFacts,
        *,
        allow_fetch: bool = True,
        variant: str | None = None,
        lease_ttl_s: float | None = None,
        holder: str = "",
        progress: FetchProgressFn | None = None,
        hold: Hold | None = None,
    ) -> Resolution:
        """Choose, and fetch if allowed, the variant of `spec` for `facts` (and of every kernel
        it depends on), with no policy beyond the store's own: the acquire path
        (`kerneld.pipeline.acquire`) with an allow-all gate, for store tools and tests. The
        daemon calls its own `Acquire`, with its gate."""
        return Acquire(self.store, self, self._fetch).acquire(
            spec,
            Best(facts, variant),
            allow_fetch=allow_fetch,
            lease_ttl_s=lease_ttl_s,
            holder=holder,
            progress=progress,
            hold=hold,
        )

    @staticmethod
    def dependencies_of(hit: LookupHit) -> list[KernelSpec]:
        """`kernel-depends` of a published tree (`kerneld.pipeline.acquire.dependencies_of`)."""
        return dependencies_of(hit)
