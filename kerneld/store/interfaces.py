"""What the store's consumers need of it, each as a few methods (containerd's content store is
`Provider + Ingester + Manager`, and each consumer takes the one it uses).

`Store` implements all of them; a consumer names the narrowest one, so reading its signature says
what it can do to the store (the fetcher writes blobs and publishes trees; it never pins, denies
or collects), and a test can hand it something smaller than a whole store. mypy checks that
`Store` keeps satisfying each protocol wherever one is passed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from .blobs import BlobInfo, BlobWriter, Expected
from .gc import GcReport
from .holds import Holds
from .leasing import Lease
from .lookup import LookupHit
from .manifest import TreeFile
from .publishing import TreeInfo
from .space import Usage
from .types import LeaseRow, NegativeRow, ProvenanceRecord, RefRow, TreeRow, VariantRow
from .verify import Problem, Quarantined, VerifyReport


class BlobProvider(Protocol):
    """Reads blobs (mirror export)."""

    def has_blob(self, sha256: str) -> bool: ...

    def open_blob(self, sha256: str) -> BinaryIO: ...


class Ingester(Protocol):
    """Writes blobs, each committed against the digest it was announced with (the fetcher,
    mirror import)."""

    def find_blob(
        self, *, sha256: str | None = None, git_sha1: str | None = None
    ) -> BlobInfo | None: ...

    def open_writer(self, expected: Expected, **ctx: str | None) -> BlobWriter: ...

    def ingest(
        self,
        source: bytes | Iterable[bytes] | BinaryIO,
        *,
        size: int,
        sha256: str | None = None,
        git_sha1: str | None = None,
        **ctx: str | None,
    ) -> BlobInfo: ...

    def ingest_file(
        self,
        path: str | os.PathLike[str],
        *,
        sha256: str | None = None,
        git_sha1: str | None = None,
        size: int | None = None,
        **ctx: str | None,
    ) -> BlobInfo: ...


class TreePublisher(Protocol):
    """Turns ingested blobs into a published variant tree, and finds one."""

    def publish_tree(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> TreeInfo: ...

    def lookup(
        self,
        repo: str,
        revision: str,
        variant: str,
        *,
        lease_ttl_s: float | None = None,
        holder: str = "",
    ) -> LookupHit | None: ...


class FetchTarget(Ingester, TreePublisher, Protocol):
    """What a download needs: blobs in, a tree out (kerneld.pipeline.fetch.Fetcher)."""


class Policy(Protocol):
    """What the store remembers about names rather than bytes: refs, the upstream's variant
    lists, failed lookups (the negative cache) and denies (kerneld.pipeline.resolve.Resolver)."""

    def check_denied(self, repo: str, revision: str, commit: str | None = None) -> None: ...

    def get_ref(self, repo: str, ref: str) -> RefRow | None: ...

    def set_ref(
        self,
        repo: str,
        ref: str,
        commit: str,
        *,
        fetched_at: float | None = None,
        versions: Iterable[int] | None = None,
    ) -> None: ...

    def get_negative(self, repo: str, revision: str, variant: str = ...) -> NegativeRow | None: ...

    def put_negative(
        self, repo: str, revision: str, variant: str, reason: str, ttl_s: float
    ) -> None: ...

    def upstream_variants(self, repo: str, commit: str) -> list[str] | None: ...

    def set_upstream_variants(self, repo: str, commit: str, names: Iterable[str]) -> None: ...

    def variants(self, repo: str, commit: str) -> list[str]: ...

    def all_refs(self) -> list[RefRow]: ...


class ResolveTarget(Policy, FetchTarget, Protocol):
    """What resolution needs: the names, and a tree for them, fetched if need be."""


class Holding(Protocol):
    """Holds (repo, commit, variant) against GC while a job of several steps runs: trees a
    prefetch or an import made stay until it is done, even under a full store."""

    @property
    def holds(self) -> Holds: ...


class PrefetchTarget(Policy, TreePublisher, Holding, Protocol):
    """What a prefetch needs: the names and denies, its trees looked up, each held until the
    whole job is done (kerneld.pipeline.prefetch.Prefetcher; the downloads go through the fetch
    function it is given)."""


class PublishTarget(Policy, Ingester, TreePublisher, BlobProvider, Holding, Protocol):
    """What publishing straight into a stopped daemon's store needs: blobs in, trees out, refs
    moved, and the trees already there (kerneld.publish.to_store)."""

    @property
    def root(self) -> Path: ...

    def published_tree(self, repo: str, commit: str, variant: str) -> TreeRow | None: ...


class Catalog(BlobProvider, Protocol):
    """What is in the store, read-only: refs, published variants and their trees, the blobs
    behind them (mirror export), and whether this handle may take leases."""

    read_only: bool

    def refs_of(self, repo: str) -> list[RefRow]: ...

    def read_document(self, name: str) -> dict[str, Any] | None: ...

    def provenance_of(self, digest: str) -> ProvenanceRecord | None: ...

    def resolve_revision(self, repo: str, revision: str) -> str | None: ...

    def variants(self, repo: str, commit: str) -> list[str]: ...

    def variants_of(self, repo: str, commit: str | None = None) -> list[VariantRow]: ...

    def published_tree(self, repo: str, commit: str, variant: str) -> TreeRow | None: ...

    def upstream_ids(self, repo: str, commit: str, variant: str) -> dict[str, str]: ...

    def acquire_lease(self, tree: str, ttl_s: float, *, holder: str = "") -> Lease: ...

    def release_lease(self, lease_id: str) -> bool: ...


class Status(Protocol):
    """How full and how healthy the store is, for readiness lines and gauges."""

    @property
    def root(self) -> Path: ...

    def usage(self) -> Usage: ...

    def quarantine_count(self) -> int: ...


class Leases(Protocol):
    """Time-bounded GC roots on trees: taken at lookup or ahead of the write, recorded in
    batches, renewed, released (kerneld.server.leases.LeaseBook)."""

    def acquire_lease(self, tree: str, ttl_s: float, *, holder: str = "") -> Lease: ...

    def record_leases(
        self,
        leases: Sequence[Lease],
        *,
        resolved: Iterable[tuple[str, float]] = (),
        per_holder: int = 0,
        total: int = 0,
    ) -> int: ...

    def renew_lease(self, lease_id: str, ttl_s: float) -> Lease: ...

    def release_lease(self, lease_id: str) -> bool: ...

    def leases(self) -> list[LeaseRow]: ...

    def guard_from_gc(self, trees: Callable[[], Iterable[str]]) -> None: ...


class Maintenance(Protocol):
    """Keeping the store sound: GC, verification, invalidating damage and the quarantine it
    goes to (``kerneldctl gc``/``verify``, the scrub, suspect reports)."""

    def gc(self, *, dry_run: bool = False) -> GcReport: ...

    def verify(
        self,
        *,
        repair: bool = False,
        on_invalidated: Callable[[str, str, str], None] | None = None,
    ) -> VerifyReport: ...

    def invalidate(
        self,
        *,
        trees: Iterable[str] = (),
        blobs: Iterable[str] = (),
        problems: Sequence[Problem] = (),
    ) -> tuple[list[tuple[str, str, str]], set[str], list[Quarantined]]: ...

    def live_tree_digests(self) -> list[str]: ...

    def quarantine(self) -> list[Quarantined]: ...

    def prune_quarantine(self) -> list[Quarantined]: ...

    def drop_quarantined(self, name: str) -> Quarantined: ...

    def restore_quarantined(self, name: str) -> list[TreeInfo]: ...

    def annotate_quarantined(self, name: str, extra: dict[str, Any]) -> Quarantined: ...

    def quarantine_count(self) -> int: ...

    def quarantine_usage(self) -> tuple[int, int]: ...


if TYPE_CHECKING:
    from .store import Store

    def _store_implements_every_protocol(
        store: Store,
    ) -> tuple[
        BlobProvider,
        Catalog,
        Status,
        Ingester,
        TreePublisher,
        FetchTarget,
        Policy,
        ResolveTarget,
        PrefetchTarget,
        PublishTarget,
        Leases,
        Maintenance,
    ]:
        """Never called: mypy checks here that `Store` keeps satisfying each protocol."""
        return store, store, store, store, store, store, store, store, store, store, store, store
