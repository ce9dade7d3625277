"""The store's parts, each as a protocol, and what each consumer takes of them (containerd's
content store is `Provider + Ingester + Manager`, and each consumer takes the one it uses).

A store is composed, not forwarded: `Store` holds one object per part (``store.blobs``,
``store.trees``, ``store.names``, ``store.catalog``, ``store.leases``, ``store.gc``,
``store.repair``, ``store.quarantine``, ``store.space``, ``store.published``,
``store.signatures``, ``store.meta``, ``store.scrub``), each typed by its protocol here. A
consumer names the part it uses, or a protocol below that lists the few parts it uses, so its
signature says what it can do to the store (the fetcher writes blobs and publishes trees; it
never pins, denies or collects). `StoreHandle` is a whole store: what `open_store` returns, the
socket for a second backend. mypy checks that `Store` keeps satisfying each protocol (the end
of ``store``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from kerneld_client.variants import PlatformFacts

from .blobs import BlobInfo, BlobWriter, Expected
from .gc import GcPolicy, GcReport
from .holds import Holds
from .leasing import Lease
from .lookup import LookupHit, PublishedFile
from .manifest import TreeFile, VariantMetadata
from .publishing import TreeInfo
from .scrub import Damage, ScrubReport
from .space import Usage
from .types import (
    ALL,
    DenyRow,
    LeaseRow,
    NegativeRow,
    PinRow,
    ProvenanceCheck,
    ProvenanceRecord,
    RefRow,
    TreeRow,
    VariantRow,
)
from .verify import Problem, Quarantined, VerifyReport

# ---- the parts ---------------------------------------------------------------------------------


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


class Blobs(BlobProvider, Ingester, Protocol):
    """``store.blobs``: blobs in and out (kerneld.store.ingest.Ingest)."""


class Trees(Protocol):
    """``store.trees``: turns ingested blobs into a published variant tree
    (kerneld.store.publishing.Publisher)."""

    def publish_tree(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> TreeInfo: ...

    def check_files_metadata(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> VariantMetadata: ...


class Policy(Protocol):
    """``store.names``: what the store remembers about names rather than bytes: refs, the
    upstream's listings, failed lookups (the negative cache), pins and denies
    (kerneld.store.names.Names)."""

    def resolve_revision(self, repo: str, revision: str) -> str | None: ...

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

    def refs_of(self, repo: str) -> list[RefRow]: ...

    def all_refs(self) -> list[RefRow]: ...

    def repos(self) -> list[str]: ...

    def upstream_versions(self, repo: str) -> list[int] | None: ...

    def get_negative(self, repo: str, revision: str, variant: str = ...) -> NegativeRow | None: ...

    def put_negative(
        self, repo: str, revision: str, variant: str, reason: str, ttl_s: float
    ) -> None: ...

    def upstream_variants(self, repo: str, commit: str) -> list[str] | None: ...

    def set_upstream_variants(self, repo: str, commit: str, names: Iterable[str]) -> None: ...

    def pin(self, repo: str, revision: str = ALL, variant: str = ALL) -> None: ...

    def unpin(self, repo: str, revision: str = ALL, variant: str = ALL) -> bool: ...

    def pins(self) -> list[PinRow]: ...

    def deny(self, repo: str, revision: str = ALL, reason: str = "") -> None: ...

    def allow(self, repo: str, revision: str = ALL) -> bool: ...

    def denies(self, repo: str | None = None) -> list[DenyRow]: ...


class Catalog(Protocol):
    """``store.catalog``: which live tree a (repo, revision, variant) names, and what the store
    holds, read-only but for the resolve time and lease a lookup records
    (kerneld.store.lookup.Lookups)."""

    def lookup(
        self,
        repo: str,
        revision: str,
        variant: str,
        *,
        lease_ttl_s: float | None = None,
        holder: str = "",
    ) -> LookupHit | None: ...

    def published_tree(self, repo: str, commit: str, variant: str) -> TreeRow | None: ...

    def published_files(
        self, repo: str, commit: str, variant: str
    ) -> tuple[Path, list[PublishedFile]] | None: ...

    def published_listing(
        self, repo: str, commit: str, variant: str
    ) -> list[PublishedFile] | None: ...

    def variants(self, repo: str, commit: str) -> list[str]: ...

    def variants_of(self, repo: str, commit: str | None = None) -> list[VariantRow]: ...

    def variants_of_tree(self, digest: str) -> list[VariantRow]: ...

    def tree(self, digest: str) -> TreeRow | None: ...

    def tree_path(self, digest: str) -> Path: ...

    def upstream_ids(self, repo: str, commit: str, variant: str) -> dict[str, str]: ...

    def live_tree_digests(self) -> list[str]: ...


class Leases(Protocol):
    """``store.leases``: time-bounded GC roots on trees: taken at lookup or ahead of the write,
    recorded in batches, renewed, released (kerneld.store.leasing.LeaseManager; the daemon's
    kerneld.server.services.leases.LeaseBook writes behind through it)."""

    def acquire(self, tree: str, ttl_s: float, *, holder: str = "") -> Lease: ...

    def record(
        self,
        leases: Sequence[Lease],
        *,
        resolved: Iterable[tuple[str, float]] = (),
        per_holder: int = 0,
        total: int = 0,
    ) -> int: ...

    def renew(self, lease_id: str, ttl_s: float) -> Lease: ...

    def release(self, lease_id: str) -> bool: ...

    def rows(self) -> list[LeaseRow]: ...


class Collection(Protocol):
    """``store.gc``: garbage collection under the site's policy, and the daemon's extra roots
    (kerneld.store.collector.Collector)."""

    policy: GcPolicy

    def collect(self, *, dry_run: bool = False, extra_bytes: int = 0) -> GcReport: ...

    def guard(self, trees: Callable[[], Iterable[str]]) -> None: ...


class Repair(Protocol):
    """``store.repair``: re-hashing what the store holds, and taking damage out of service
    (kerneld.store.repair.Repairer)."""

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


class QuarantineArea(Protocol):
    """``store.quarantine``: where damaged trees and blobs go, bounded by ``max_bytes``
    (kerneld.store.quarantine.Quarantine)."""

    max_bytes: int

    def entries(self) -> list[Quarantined]: ...

    def prune(self) -> list[Quarantined]: ...

    def drop(self, name: str) -> Quarantined: ...

    def restore(self, name: str) -> list[TreeInfo]: ...

    def annotate(self, name: str, extra: dict[str, Any]) -> Quarantined: ...

    def count(self) -> int: ...

    def usage(self) -> tuple[int, int]: ...


class Capacity(Protocol):
    """``store.space``: how full the store is (kerneld.store.space.Space)."""

    def usage(self) -> Usage: ...


class PublishedIndex(Protocol):
    """``store.published``: the published index clients read without the daemon, its
    generation, and the store-wide documents beside it
    (kerneld.store.published_index_writer.PublishedIndexWriter)."""

    @property
    def generation(self) -> int: ...

    @property
    def directory(self) -> Path: ...

    def set_platforms(self, platforms: Iterable[PlatformFacts]) -> None: ...

    def publish_document(self, name: str, doc: dict[str, Any]) -> None: ...

    def read_document(self, name: str) -> dict[str, Any] | None: ...


class Provenance(Protocol):
    """``store.signatures``: the installed signature check and its records
    (kerneld.store.signatures.Signatures)."""

    check: ProvenanceCheck | None

    def install(self, check: ProvenanceCheck | None) -> None: ...

    def record_of(self, digest: str) -> ProvenanceRecord | None: ...


class Scrubbing(Protocol):
    """``store.scrub``: re-hashing the store slowly in the background, or one reported tree
    now, taking confirmed damage out of service (kerneld.store.scrub.Scrub)."""

    def run_pass(
        self,
        *,
        rate: int,
        stop: threading.Event,
        on_damage: Callable[[Damage], None] | None = None,
    ) -> ScrubReport: ...

    def check_tree(
        self, digest: str, *, on_damage: Callable[[Damage], None] | None = None
    ) -> ScrubReport: ...


class Facts(Protocol):
    """``store.meta``: small store-level facts (kerneld.store.meta.Meta)."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str | None) -> None: ...


# ---- what consumers take: a few parts each ----------------------------------------------------


class Holding(Protocol):
    """Holds (repo, commit, variant) against GC while a job of several steps runs: trees a
    prefetch or an import made stay until it is done, even under a full store."""

    @property
    def holds(self) -> Holds: ...


class FetchTarget(Protocol):
    """What a download needs: blobs in, a tree out (kerneld.pipeline.fetch.Fetcher)."""

    @property
    def blobs(self) -> Ingester: ...

    @property
    def trees(self) -> Trees: ...


class ResolveTarget(FetchTarget, Protocol):
    """What resolution needs: the names, the trees they find, and what a store tool's resolver
    downloads into (kerneld.pipeline.resolve.Resolver, the ref refresher, the acquire gate)."""

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...


class PrefetchTarget(ResolveTarget, Holding, Protocol):
    """What a prefetch needs: the names and denies, its trees looked up, each held until the
    whole job is done (kerneld.pipeline.prefetch.Prefetcher)."""


class PublishTarget(ResolveTarget, Holding, Protocol):
    """What publishing straight into a stopped daemon's store needs: blobs in, trees out, refs
    moved, and the trees already there (kerneld.publish.to_store)."""

    @property
    def root(self) -> Path: ...

    @property
    def blobs(self) -> Blobs: ...

    @property
    def trees(self) -> Trees: ...


class VerdictSource(Protocol):
    """What an export reads its verdicts from: signature records and published documents."""

    @property
    def signatures(self) -> Provenance: ...

    @property
    def published(self) -> PublishedIndex: ...


class ExportSource(VerdictSource, Protocol):
    """What a mirror export reads, read-only: refs, published variants and their trees, the
    blobs behind them, verdicts, and leases on what it exports (unless this handle may take
    none)."""

    read_only: bool

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def blobs(self) -> BlobProvider: ...

    @property
    def leases(self) -> Leases: ...


class Status(Protocol):
    """How full and how healthy the store is, for readiness lines and gauges."""

    @property
    def root(self) -> Path: ...

    @property
    def space(self) -> Capacity: ...

    @property
    def quarantine(self) -> QuarantineArea: ...


class ServingView(Holding, Protocol):
    """What the daemon's serving reads and writes beside the acquire path: refs and upstream
    listings (`names`), the variants held (`catalog`), leases, holds, and the published
    generation its remembered answers are keyed by (kerneld/server/services/serving.py)."""

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def leases(self) -> Leases: ...

    @property
    def published(self) -> PublishedIndex: ...


class ScrubTarget(Holding, Protocol):
    """What the background scrub uses: the pass itself, its cursor in the store's facts, the
    quarantine it prunes, and the trees a re-fetch holds (kerneld/server/services/scrubber.py)."""

    @property
    def scrub(self) -> Scrubbing: ...

    @property
    def meta(self) -> Facts: ...

    @property
    def quarantine(self) -> QuarantineArea: ...

    @property
    def catalog(self) -> Catalog: ...


class ReportTarget(Protocol):
    """What a job's report of a damaged tree is checked with: the trees served, the check
    itself and the quarantine it annotates (kerneld/server/fronts/rpc/suspect.py)."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def scrub(self) -> Scrubbing: ...

    @property
    def quarantine(self) -> QuarantineArea: ...


class ImportTarget(Holding, Protocol):
    """What a mirror import writes into: blobs in, trees out, refs and denies, the published
    verdicts it records, the space it checks first (kerneld/mirror/import_.py)."""

    @property
    def blobs(self) -> Blobs: ...

    @property
    def trees(self) -> Trees: ...

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def published(self) -> PublishedIndex: ...

    @property
    def space(self) -> Capacity: ...


class InventorySource(Protocol):
    """What an inventory lists: names, trees, leases and signature records
    (kerneld/store/inventory.py)."""

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def leases(self) -> Leases: ...

    @property
    def signatures(self) -> Provenance: ...


class StoreHandle(Protocol):
    """A whole store, as a daemon or a tool holds it: every part, and opening's counterpart.
    `open_store` returns one; a second backend implements this."""

    read_only: bool

    @property
    def root(self) -> Path: ...

    @property
    def blobs(self) -> Blobs: ...

    @property
    def trees(self) -> Trees: ...

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def leases(self) -> Leases: ...

    @property
    def gc(self) -> Collection: ...

    @property
    def repair(self) -> Repair: ...

    @property
    def quarantine(self) -> QuarantineArea: ...

    @property
    def space(self) -> Capacity: ...

    @property
    def published(self) -> PublishedIndex: ...

    @property
    def signatures(self) -> Provenance: ...

    @property
    def meta(self) -> Facts: ...

    @property
    def scrub(self) -> Scrubbing: ...

    @property
    def holds(self) -> Holds: ...

    def scratch_file(self, name: str) -> AbstractContextManager[Path]: ...

    def owner_is_running(self) -> bool: ...

    def mark_as_cache(self) -> None: ...

    def close(self) -> None: ...
