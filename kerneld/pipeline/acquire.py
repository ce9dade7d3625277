"""The one path from a kernel's name to a verified tree in the store: every caller takes it.

gRPC `Resolve` and `ListVariants`, the Hub API endpoint, prefetch (the daemon's and
`kerneldctl prefetch --store`), the scrub's re-fetch and the store tools' `Resolver.resolve`
all call `Acquire.acquire` (or its first steps alone: `commit_of`, `listing`, `admitted`), so
the sequence is written once:

1. field bounds of the name asked for, then the deny of the repo and the ref, before any I/O;
2. the ref's commit (the resolver's TTL cache, stale while every upstream is down), and the
   deny of that commit;
3. the commit's variant names (cached forever: commits are immutable);
4. publisher trust, asked only now that the listing proves the repo exists (a made-up name
   costs no Hub request);
5. for each variant the plan picks: hold it from GC, look it up, fetch it when missing
   (single-flight and verified, counted as in-flight work and recorded by the gate), look it
   up again;
6. its `kernel-depends`: resolved through the same path (`Best`) or handed back (`Listed`).

What the host decides around the sequence is its `AcquireGate`: the daemon's
(`kerneld.server.services.gate`: bounds, publisher trust, the fetch history), or `ALLOW_ALL` for a
store tool, which has no policy. Which variants is the plan's: `Best` (the one a platform
loads: Resolve), `Listed` (a set chosen from the listing: prefetch) or `Named` (one variant of
a commit its caller already admitted: the Hub endpoint's bytes, the scrub's re-fetch). A
caller's own admission to the network (`[fetch] allow_groups`, its budget) is the front end's,
passed in as `before_fetch`. The Hub endpoint's listings of refs and of a variant's files
(`upstream_refs`, `upstream_files`) are asked here too: no front end walks the upstreams.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol, TypeVar, overload

from kerneld.pipeline.fetch import FetchResult, VariantFetcher
from kerneld.pipeline.fetch_progress import FetchProgressFn
from kerneld.pipeline.plans import Batch, Best, Got, Listed, Listing, Named, Outcome
from kerneld.pipeline.request import (
    DependencyCycle,
    FetchNotAllowed,
    KernelSpec,
    NoVariantFits,
    Resolution,
)
from kerneld.store import (
    Catalog,
    Hold,
    LookupHit,
    MetadataError,
    Policy,
    ResourceExhaustedError,
    TreeNotFoundError,
)
from kerneld.upstream.base import Refs, RemoteFile, Upstream
from kerneld.upstream.errors import EntryNotFound, UpstreamError
from kerneld_client.metadata import kernel_depends
from kerneld_client.variants import decide

log = logging.getLogger("kerneld.acquire")

T = TypeVar("T")


class AcquireGate(Protocol):
    """What the host decides around the sequence (the daemon's
    `kerneld.server.services.gate.DaemonGate`; `ALLOW_ALL` for a store tool)."""

    def check_fields(
        self, repo_id: str, revision: str = "", variant: str = "", path: str = ""
    ) -> None:
        """Raise when a field is over its bound."""

    def check_publisher(
        self, repo_id: str, *, trust_remote_code: bool, parents: Sequence[str] = ()
    ) -> None:
        """Raise unless jobs may run `repo_id`'s code (asked once the repo is known to exist)."""

    def work(self) -> AbstractContextManager[None]:
        """Count a fetch as in-flight work (a shutdown drains it)."""

    def fetched(
        self,
        repo_id: str,
        commit: str,
        variant: str,
        result: FetchResult | None,
        error: BaseException | None,
    ) -> None:
        """One fetch ended, with its result or its error (the fetch history)."""


class AllowAll:
    """The gate of a store tool: no bounds beyond the store's own, every publisher, no record."""

    def check_fields(
        self, repo_id: str, revision: str = "", variant: str = "", path: str = ""
    ) -> None:
        return None

    def check_publisher(
        self, repo_id: str, *, trust_remote_code: bool, parents: Sequence[str] = ()
    ) -> None:
        return None

    def work(self) -> AbstractContextManager[None]:
        return nullcontext()

    def fetched(
        self,
        repo_id: str,
        commit: str,
        variant: str,
        result: FetchResult | None,
        error: BaseException | None,
    ) -> None:
        return None


ALLOW_ALL = AllowAll()


class Listings(Protocol):
    """Refs and listings (kerneld.pipeline.resolve.Resolver): steps 2-3 of the sequence."""

    def commit_for(
        self,
        spec: KernelSpec,
        *,
        allow_network: bool = True,
        refresh: bool = False,
        record: bool = True,
    ) -> tuple[str, bool]: ...

    def variant_names(
        self, repo_id: str, commit: str, *, allow_network: bool = True
    ) -> list[str]: ...

    def answers_locally(self, spec: KernelSpec) -> bool: ...

    def lists_locally(self, repo_id: str, commit: str) -> bool: ...

    @property
    def upstreams(self) -> Sequence[Upstream]: ...


class AcquireTarget(Protocol):
    """What the sequence reads of the store: denies and refs (`names`), and trees looked up
    (`catalog`)."""

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...


# ---- the path ------------------------------------------------------------------------------------


class Acquire:
    """The sequence over one store, its refs and listings, one fetcher and the host's gate."""

    def __init__(
        self,
        store: AcquireTarget,
        listings: Listings,
        fetcher: VariantFetcher,
        gate: AcquireGate = ALLOW_ALL,
    ) -> None:
        self.store = store
        self.listings = listings
        self.gate = gate
        self._fetcher = fetcher

    # ---- checks a front end makes before it asks anything ------------------------------------

    def check_fields(
        self, repo_id: str, revision: str = "", variant: str = "", path: str = ""
    ) -> None:
        """RequestTooLarge (INVALID_ARGUMENT) for a field over its bound."""
        self.gate.check_fields(repo_id, revision, variant, path)

    def check_denied(self, repo_id: str, ref: str, commit: str | None = None) -> None:
        """DeniedError when an admin denied the repo, the ref, or the commit it names."""
        self.store.names.check_denied(repo_id, ref, commit)

    def check_publisher(
        self, repo_id: str, *, trust_remote_code: bool, parents: Sequence[str] = ()
    ) -> None:
        """Refused unless jobs may run `repo_id`'s code; only for a repo known to exist."""
        self.gate.check_publisher(repo_id, trust_remote_code=trust_remote_code, parents=parents)

    # ---- the first steps alone ----------------------------------------------------------------

    def commit_of(
        self,
        spec: KernelSpec,
        *,
        allow_network: bool = True,
        refresh: bool = False,
        record: bool = True,
    ) -> tuple[str, bool]:
        """Steps 1-2: (the commit `spec` names now, stale), past its bounds and denies (the Hub
        endpoint's revision answers). `record=False` leaves the recorded ref where it is
        (prefetch moves it itself once the commit's trees are here)."""
        self.check_fields(spec.repo_id, spec.ref)
        self.store.names.check_denied(spec.repo_id, spec.ref)  # before any I/O
        commit, stale = self.listings.commit_for(
            spec, allow_network=allow_network, refresh=refresh, record=record
        )
        self.store.names.check_denied(spec.repo_id, spec.ref, commit)
        return commit, stale

    def listing(
        self,
        spec: KernelSpec,
        *,
        allow_network: bool = True,
        refresh: bool = False,
        record: bool = True,
    ) -> Listing:
        """Steps 1-3: the commit and the variants it lists (ListVariants: nothing fetched, no
        publisher asked)."""
        commit, stale = self.commit_of(
            spec, allow_network=allow_network, refresh=refresh, record=record
        )
        names = self.listings.variant_names(spec.repo_id, commit, allow_network=allow_network)
        return Listing(spec, commit, stale, names)

    def admitted(
        self,
        spec: KernelSpec,
        *,
        allow_network: bool = True,
        refresh: bool = False,
        record: bool = True,
        trust_remote_code: bool = False,
        parents: Sequence[str] = (),
    ) -> Listing:
        """Steps 1-4: the listing, once the publisher is trusted (the Hub endpoint's file
        listings; every plan starts here)."""
        listing = self.listing(spec, allow_network=allow_network, refresh=refresh, record=record)
        # The commit is listed (here or upstream): the repo exists, its publisher may be asked.
        self.check_publisher(spec.repo_id, trust_remote_code=trust_remote_code, parents=parents)
        return listing

    # ---- what a front end asks before it charges a caller for the network -------------------

    def answers_locally(self, spec: KernelSpec) -> bool:
        """Would `commit_of` answer without asking an upstream?"""
        return self.listings.answers_locally(spec)

    def lists_locally(self, repo_id: str, commit: str) -> bool:
        """Would `listing` name the commit's variants without asking an upstream?"""
        return self.listings.lists_locally(repo_id, commit)

    # ---- what the Hub endpoint lists of a repo beyond the sequence ---------------------------

    def upstream_refs(self, repo_id: str, failures: list[UpstreamError]) -> Refs | None:
        """The repo's branches and tags from the first upstream that answers (None: none did;
        each failure is appended to `failures`)."""
        for upstream in self.listings.upstreams:
            try:
                return upstream.list_refs(repo_id)
            except UpstreamError as exc:
                failures.append(exc)
        return None

    def upstream_files(
        self, repo_id: str, commit: str, variant: str, failures: list[UpstreamError]
    ) -> list[RemoteFile] | None:
        """A variant's files as the first upstream that answers lists them (None: none did;
        each failure is appended to `failures` and logged)."""
        for upstream in self.listings.upstreams:
            try:
                return upstream.list_files(repo_id, commit, variant)
            except UpstreamError as exc:
                failures.append(exc)
                log.info(
                    "cannot list repo=%s commit=%s variant=%s upstream=%s: %s",
                    repo_id,
                    commit,
                    variant,
                    upstream.name,
                    exc,
                )
        return None

    # ---- the whole path -------------------------------------------------------------------------

    @overload
    def acquire(
        self,
        spec: KernelSpec,
        plan: Best,
        *,
        allow_fetch: bool = ...,
        refresh: bool = ...,
        record: bool = ...,
        hold: Hold | None = ...,
        lease_ttl_s: float | None = ...,
        holder: str = ...,
        progress: FetchProgressFn | None = ...,
        trust_remote_code: bool = ...,
        before_fetch: Callable[[], None] | None = ...,
    ) -> Resolution: ...

    @overload
    def acquire(
        self,
        spec: KernelSpec,
        plan: Listed,
        *,
        allow_fetch: bool = ...,
        refresh: bool = ...,
        record: bool = ...,
        hold: Hold | None = ...,
        lease_ttl_s: float | None = ...,
        holder: str = ...,
        progress: FetchProgressFn | None = ...,
        trust_remote_code: bool = ...,
        before_fetch: Callable[[], None] | None = ...,
    ) -> Batch: ...

    @overload
    def acquire(
        self,
        spec: KernelSpec,
        plan: Named[T],
        *,
        allow_fetch: bool = ...,
        refresh: bool = ...,
        record: bool = ...,
        hold: Hold | None = ...,
        lease_ttl_s: float | None = ...,
        holder: str = ...,
        progress: FetchProgressFn | None = ...,
        trust_remote_code: bool = ...,
        before_fetch: Callable[[], None] | None = ...,
    ) -> Got[T]: ...

    def acquire(
        self,
        spec: KernelSpec,
        plan: Best | Listed | Named[T],
        *,
        allow_fetch: bool = True,
        refresh: bool = False,
        record: bool = True,
        hold: Hold | None = None,
        lease_ttl_s: float | None = None,
        holder: str = "",
        progress: FetchProgressFn | None = None,
        trust_remote_code: bool = False,
        before_fetch: Callable[[], None] | None = None,
    ) -> Resolution | Batch | Got[T]:
        """Get what `plan` picks of `spec` into the store (see the module docstring).

        `allow_fetch=False` answers from the store and the cached listings alone; `hold`
        keeps every variant looked up or fetched from GC until its caller closes it (a later
        fetch cannot evict what the answer names); `lease_ttl_s`/`holder` lease what `Best`
        finds; `before_fetch` admits the caller to the network before the first download
        (raise to refuse)."""
        step = _Step(self, hold, allow_fetch, lease_ttl_s, holder, progress, before_fetch)
        if isinstance(plan, Named):
            return self._named(spec, plan, step)
        if isinstance(plan, Listed):
            return self._listed(
                spec, plan, step, refresh=refresh, record=record, trust=trust_remote_code
            )
        return self._best(spec, plan, step, trust_remote_code, ())

    def _best(
        self,
        spec: KernelSpec,
        plan: Best,
        step: _Step,
        trust_remote_code: bool,
        stack: tuple[str, ...],
    ) -> Resolution:
        if spec.repo_id in stack:
            raise DependencyCycle(
                "kernel-depends cycle: " + " -> ".join((*stack, spec.repo_id)),
                repo_id=spec.repo_id,
            )
        listing = self.admitted(
            spec,
            allow_network=step.allow_fetch,
            refresh=False,
            record=True,
            trust_remote_code=trust_remote_code,
            parents=stack,
        )
        commit = listing.commit
        decisions = decide(listing.names, plan.facts)
        if plan.variant is not None:
            candidates = [d for d in decisions if d.variant == plan.variant]
        else:
            candidates = [d for d in decisions if d.accepted]
        if not candidates:
            raise NoVariantFits(decisions, repo_id=spec.repo_id, revision=commit)
        best = candidates[0].variant
        find = step.lookup
        hit, fetched = step.variant(spec.repo_id, commit, best, find)
        if hit is None:
            # Without a fetch, the best accepted variant that is already here will do.
            for cand in candidates[1:]:
                hit, _ = step.variant(spec.repo_id, commit, cand.variant, find)
                if hit is not None:
                    best = cand.variant
                    break
            else:
                raise FetchNotAllowed(
                    f"variant {best} is not in the store and fetching is not allowed",
                    repo_id=spec.repo_id,
                    revision=commit,
                )
        deps = [
            self._best(dep, Best(plan.facts), step, trust_remote_code, (*stack, spec.repo_id))
            for dep in dependencies_of(hit)
        ]
        return Resolution(spec, commit, listing.stale, best, hit, decisions, fetched, deps)

    def _listed(
        self,
        spec: KernelSpec,
        plan: Listed,
        step: _Step,
        *,
        refresh: bool,
        record: bool,
        trust: bool,
    ) -> Batch:
        listing = self.admitted(
            spec,
            allow_network=step.allow_fetch,
            refresh=refresh,
            record=record,
            trust_remote_code=trust,
            parents=(),
        )
        repo, commit, names = spec.repo_id, listing.commit, listing.names
        outcomes: list[Outcome] = []
        for variant, why in plan.choose(listing).items():
            plan.before(variant)
            try:
                if variant not in names:
                    raise EntryNotFound(
                        f"no variant {variant} (it has: {', '.join(sorted(names)) or 'none'})",
                        repo_id=repo,
                        revision=commit,
                    )
                hit, fetched = step.variant(repo, commit, variant, step.lookup)
                if hit is None:
                    raise FetchNotAllowed(
                        f"variant {variant} is not in the store and fetching is not allowed",
                        repo_id=repo,
                        revision=commit,
                    )
                outcome = Outcome(variant, why, hit, fetched, None, dependencies_of(hit))
            except Exception as exc:
                outcome = Outcome(variant, why, None, error=exc)
            outcomes.append(outcome)
            plan.after(outcome)
        return Batch(listing, outcomes)

    def _named(self, spec: KernelSpec, plan: Named[T], step: _Step) -> Got[T]:
        repo, commit = spec.repo_id, spec.ref
        self.check_fields(repo, commit, plan.variant)
        self.store.names.check_denied(repo, commit, commit)
        if plan.every_ref:  # rare (a scrub's re-fetch): every ref, filtered here
            for row in self.store.names.all_refs():
                if row.repo == repo and row.commit == commit:
                    self.store.names.check_denied(repo, row.ref, commit)
        found, fetched = step.variant(repo, commit, plan.variant, plan.find)
        if found is None:
            raise FetchNotAllowed(
                f"variant {plan.variant} is not in the store and fetching is not allowed",
                repo_id=repo,
                revision=commit,
            )
        return Got(found, fetched)

    def _fetch(
        self, repo_id: str, commit: str, variant: str, progress: FetchProgressFn | None
    ) -> FetchResult:
        """Download, verify and publish one variant (single-flight: concurrent callers share
        one download), counted as in-flight work and recorded by the gate."""
        gate = self.gate
        with gate.work():
            try:
                result = self._fetcher.fetch_variant(repo_id, commit, variant, progress=progress)
            except Exception as exc:
                gate.fetched(repo_id, commit, variant, None, exc)
                raise
        gate.fetched(repo_id, commit, variant, result, None)
        return result


@dataclass(frozen=True)
class _Step:
    """Step 5 for one call: hold, look up, fetch when missing, look up again."""

    acquire: Acquire
    hold: Hold | None
    allow_fetch: bool
    lease_ttl_s: float | None
    holder: str
    progress: FetchProgressFn | None
    before_fetch: Callable[[], None] | None

    def lookup(self, repo: str, commit: str, variant: str) -> LookupHit | None:
        return self.acquire.store.catalog.lookup(
            repo, commit, variant, lease_ttl_s=self.lease_ttl_s, holder=self.holder
        )

    def variant(
        self, repo: str, commit: str, variant: str, find: Callable[[str, str, str], T | None]
    ) -> tuple[T | None, FetchResult | None]:
        """(the tree, the fetch that brought it); (None, None) when it is not here and this
        call may not fetch."""
        if self.hold is not None:
            self.hold.add(repo, commit, variant)
        found = find(repo, commit, variant)
        if found is not None or not self.allow_fetch:
            return found, None
        if self.before_fetch is not None:
            self.before_fetch()
        fetched = self.acquire._fetch(repo, commit, variant, self.progress)
        found = find(repo, commit, variant)
        if found is None:
            raise _gone(repo, commit, variant, fetched, held=self.hold is not None)
        return found, fetched


def _gone(
    repo: str, commit: str, variant: str, fetched: FetchResult, *, held: bool
) -> ResourceExhaustedError | TreeNotFoundError:
    """The error for a tree fetched and gone before it could be handed out."""
    if held:  # GC cannot take a held tree; a repair or an admin's deny did
        return TreeNotFoundError(
            "the tree was taken out of service right after its fetch (a repair or a deny); "
            "ask for it again",
            repo_id=repo,
            commit=commit,
            variant=variant,
        )
    # Without a hold, a reservation's GC may collect a tree between its publish and the
    # lookup; under the cap that is the cap doing its job, not a fault.
    return ResourceExhaustedError(
        fetched.tree.size,
        0,
        "store cap (the tree was collected right after its fetch to make room for others)",
        repo_id=repo,
        commit=commit,
        variant=variant,
    )


def dependencies_of(hit: LookupHit) -> list[KernelSpec]:
    """`kernel-depends` of a published tree's metadata.json.

    A malformed list is a MetadataError (the build is broken): serving the kernel without a
    dependency it declares would only fail later, inside the user's process.
    """
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
