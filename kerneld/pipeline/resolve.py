"""Turn a request (repo, version or revision, platform facts) into a verified tree in the store.

Steps: revision -> commit (ref cache with TTL, serve-stale when every upstream is down, short
negative cache), commit -> variant names (cached forever: commits are immutable), names + facts
-> best accepted variant (kerneld_client.variants, the same rules as the client), then a store
hit or a single-flight fetch, then `kernel-depends` recursively.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kerneld.pipeline.fetch import Fetcher, FetchResult, VariantFetcher
from kerneld.pipeline.fetch_progress import FetchProgressFn
from kerneld.store import Hold, LookupHit, MetadataError, ResolveTarget, ResourceExhaustedError
from kerneld.upstream.base import Upstream, check_repo_id
from kerneld.upstream.errors import (
    RepoNotFound,
    RevisionNotFound,
    UpstreamError,
    UpstreamUnavailable,
    every_upstream,
)
from kerneld_client.metadata import kernel_depends
from kerneld_client.single_flight import SingleFlight
from kerneld_client.variants import Decision, PlatformFacts, decide
from kerneld_client.vocabulary import is_commit

log = logging.getLogger("kerneld.resolve")

LISTING_RETRY_S = 30.0
"""After every upstream failed to list a commit's variants (or a ref could not be re-checked),
they are not asked again for this long: during an outage each job is answered from what is
here, instead of costing every upstream its retries again (a restarted daemon has no answers
of its own yet)."""


@dataclass(frozen=True)
class KernelSpec:
    """What a caller asks for. At most one of version, revision, locked_commit."""

    repo_id: str
    version: int | None = None
    revision: str | None = None
    locked_commit: str | None = None

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)
        given = [x is not None for x in (self.version, self.revision, self.locked_commit)]
        if sum(given) > 1:
            raise ValueError("give at most one of version, revision and locked_commit")
        if self.locked_commit is not None and not is_commit(self.locked_commit):
            raise ValueError(f"locked commit must be 40 lowercase hex: {self.locked_commit!r}")
        if self.version is not None and self.version < 0:
            raise ValueError(f"version must be >= 0, got {self.version}")

    @property
    def ref(self) -> str:
        """The ref to resolve: `vN` for a version (versions are branches), else the revision."""
        if self.locked_commit is not None:
            return self.locked_commit
        if self.version is not None:
            return f"v{self.version}"
        return self.revision or "main"

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.ref}"


class ResolveError(Exception):
    """Base of resolution failures that are not upstream or store errors."""

    def __init__(self, message: str, *, repo_id: str = "", revision: str = "") -> None:
        self.message = message
        self.repo_id = repo_id
        self.revision = revision
        where = "@".join(p for p in (repo_id, revision) if p)
        super().__init__(f"{where}: {message}" if where else message)


class NoVariantFits(ResolveError):
    """No variant of the commit fits the platform (each decision says why); the client raises
    its `NoCompatibleVariant`, `kernels`' name, for it."""

    def __init__(
        self,
        decisions: Sequence[Decision],
        *,
        repo_id: str,
        revision: str,
        detail: str | None = None,
    ) -> None:
        self.decisions = list(decisions)
        if detail is None:
            said = "; ".join(f"{d.variant}: {d.reason}" for d in self.decisions) or "no variants"
            detail = f"no build variant fits this platform ({said})"
        super().__init__(detail, repo_id=repo_id, revision=revision)


class FetchNotAllowed(ResolveError):
    """The kernel is not in the store and this request may not trigger a download."""


class DependencyCycle(ResolveError):
    pass


Admit = Callable[["KernelSpec", str, Sequence[str]], None]
"""The daemon's policy for one kernel once its commit is known and listed (so the repo exists),
before any variant of it is fetched: raises to refuse.
Called with the spec, the commit and the chain of kernels that depend on it (outermost first)."""


@dataclass(frozen=True)
class Resolution:
    spec: KernelSpec
    commit: str
    stale: bool
    variant: str
    hit: LookupHit
    decisions: list[Decision]
    fetched: FetchResult | None = None
    dependencies: list[Resolution] = field(default_factory=list)


class _VersionMissing(Exception):
    """An upstream listed the repo's versions and the one asked for is not among them."""

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
        """`fetch` downloads a variant the store lacks: the daemon passes its acquire service
        (policy, history); a store tool gets a plain `Fetcher` over the same upstreams."""
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
        re-checked in the background (`kerneld.server.refresh`), which is not a failure."""
        self._outage_since: float | None = None
        """When the first stale ref of the current outage was served (None: no outage)."""
        self._variants_flight: SingleFlight[tuple[str, str, bool], list[str]] = SingleFlight()
        self._unlisted: dict[tuple[str, str], tuple[float, UpstreamError]] = {}
        """(repo, commit) -> when and how every upstream last failed to list its variants."""

    def reconfigure(
        self, upstreams: Sequence[Upstream], *, ref_ttl_s: float, negative_ttl_s: float
    ) -> None:
        """A reload's new upstream chain and TTLs (the fetch side is the acquire service's)."""
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

    # -- resolve -------------------------------------------------------------------------------

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
        admit: Admit | None = None,
        _stack: tuple[str, ...] = (),
    ) -> Resolution:
        """Choose, and fetch if allowed, the variant of `spec` for `facts` (and of every
        kernel it depends on). With `hold`, every variant looked up or fetched is held from GC
        until the caller closes the hold: a dependency's fetch, or another request's, cannot
        evict what this answer names before the caller has leased it. `admit` is the
        daemon's policy, applied to each kernel as soon as its commit is known (before any of
        its variants is fetched)."""
        if spec.repo_id in _stack:
            raise DependencyCycle(
                "kernel-depends cycle: " + " -> ".join((*_stack, spec.repo_id)),
                repo_id=spec.repo_id,
            )
        # Denies are checked before any I/O: a denied kernel is never fetched either.
        self.store.names.check_denied(spec.repo_id, spec.ref)
        commit, stale = self.commit_for(spec, allow_network=allow_fetch)
        self.store.names.check_denied(spec.repo_id, spec.ref, commit)
        names = self.variant_names(spec.repo_id, commit, allow_network=allow_fetch)
        if admit is not None:  # the commit is listed (here or upstream): the repo exists
            admit(spec, commit, _stack)
        decisions = decide(names, facts)
        if variant is not None:
            chosen = [d for d in decisions if d.variant == variant]
            if not chosen:
                raise NoVariantFits(decisions, repo_id=spec.repo_id, revision=commit)
            candidates = chosen
        else:
            candidates = [d for d in decisions if d.accepted]
        if not candidates:
            raise NoVariantFits(decisions, repo_id=spec.repo_id, revision=commit)
        best = candidates[0].variant
        if hold is not None:
            hold.add(spec.repo_id, commit, best)
        hit = self.store.catalog.lookup(
            spec.repo_id, commit, best, lease_ttl_s=lease_ttl_s, holder=holder
        )
        fetched: FetchResult | None = None
        if hit is None and not allow_fetch:
            # Without a fetch, the best accepted variant that is already here will do.
            for cand in candidates[1:]:
                if hold is not None:
                    hold.add(spec.repo_id, commit, cand.variant)
                hit = self.store.catalog.lookup(
                    spec.repo_id, commit, cand.variant, lease_ttl_s=lease_ttl_s, holder=holder
                )
                if hit is not None:
                    best = cand.variant
                    break
            else:
                raise FetchNotAllowed(
                    f"variant {best} is not in the store and fetching is not allowed",
                    repo_id=spec.repo_id,
                    revision=commit,
                )
        if hit is None:
            fetched = self._fetch.fetch_variant(spec.repo_id, commit, best, progress=progress)
            hit = self.store.catalog.lookup(
                spec.repo_id, commit, best, lease_ttl_s=lease_ttl_s, holder=holder
            )
            if hit is None:
                # Without a hold, a reservation's GC may collect a tree between its publish
                # and this lookup; under the cap that is the cap doing its job, not a fault.
                raise ResourceExhaustedError(
                    fetched.tree.size,
                    0,
                    "store cap (the tree was collected right after its fetch to make room "
                    "for others)",
                    repo_id=spec.repo_id,
                    commit=commit,
                    variant=best,
                )
        deps = [
            self.resolve(
                dep,
                facts,
                allow_fetch=allow_fetch,
                lease_ttl_s=lease_ttl_s,
                holder=holder,
                progress=progress,
                hold=hold,
                admit=admit,
                _stack=(*_stack, spec.repo_id),
            )
            for dep in self.dependencies_of(hit)
        ]
        return Resolution(spec, commit, stale, best, hit, decisions, fetched, deps)

    def dependencies_of(self, hit: LookupHit) -> list[KernelSpec]:
        """`kernel-depends` of a published tree's metadata.json.

        A malformed list is a MetadataError (the build is broken): serving the kernel without a
        dependency it declares would only fail later, inside the user's process.
        """
        import json

        try:
            meta = json.loads((hit.path / "metadata.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return []
        try:  # a bad entry, or a repo id no spec can name
            return [
                KernelSpec(d.repo_id, version=d.version, revision=d.revision)
                for d in kernel_depends(meta)
            ]
        except ValueError as exc:
            raise MetadataError(
                f"metadata.json: {exc}; the kernel's build is malformed, ask its author to fix it",
                repo_id=hit.repo,
                commit=hit.commit,
                variant=hit.variant,
            ) from None
