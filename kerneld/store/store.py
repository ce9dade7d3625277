"""The :class:`Store` facade: one object that owns a store directory.

The work is done by small parts the store holds, each with only the dependencies it uses
(``state`` lists what they share): ``ingest`` (blobs in), ``publishing`` (trees out),
``lookup`` (which tree a name resolves to), ``names`` (refs, upstream facts, the negative
cache, pins, denies), ``signatures`` (provenance), ``leasing``, ``space`` and ``collector``
(reservations and GC), ``quarantine`` and ``repair`` (verify, repair, invalidate),
``recovery`` (at open) and ``published_index_writer``. This module opens and closes the store and
keeps the one set of method names its callers use (``interfaces`` has the narrow views).

Thread-safe: every index access and every rename into or out of ``blobs/``/``trees/`` happens
under one in-process lock; hashing, downloads, staging builds and file deletion happen outside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from . import gc as gc_mod
from . import verify as verify_mod
from .blobs import BlobInfo, BlobWriter, Expected
from .collector import Collector
from .holds import Holds
from .index import Index
from .ingest import Ingest
from .layout import Layout, write_cachedir_tag
from .leasing import Lease, LeaseManager
from .locks import OwnerLock, owner_is_running
from .lookup import LookupHit, Lookups, PublishedFile
from .manifest import TreeFile, VariantMetadata
from .names import Names
from .ownership import opening_step, root_owner, take_ownership
from .paths import tree_hex
from .picks import Picker
from .published_index_writer import PublishedIndexWriter
from .publishing import Publisher, TreeInfo
from .quarantine import Quarantine
from .recovery import recover
from .repair import Invalidated, Repairer
from .signatures import ProvenanceCheck, Signatures
from .space import Space, Usage
from .state import StoreState
from .types import (
    ALL,
    DenyRow,
    LeaseRow,
    NegativeRow,
    PinRow,
    ProvenanceRecord,
    RefRow,
    TreeRow,
    VariantRow,
)

if TYPE_CHECKING:
    from kerneld_client.variants import PlatformFacts

log = logging.getLogger("kerneld.store")


class Store:
    """A content-addressed store of blobs and read-only variant trees (see ``layout``)."""

    def __init__(
        self,
        layout: Layout,
        index: Index,
        owner: OwnerLock | None,
        policy: gc_mod.GcPolicy,
        *,
        require_metadata_digest: bool,
        use_hardlinks: bool,
        auto_gc: bool,
        partial_grace_s: float,
        owner_uid: int | None = None,
    ) -> None:
        self.layout = layout
        self.index = index
        self.read_only = owner is None
        self.require_metadata_digest = require_metadata_digest
        self.use_hardlinks = use_hardlinks
        self.auto_gc = auto_gc
        self.partial_grace_s = partial_grace_s
        self._owner = owner
        self._state = state = StoreState(layout, index, self.read_only, policy)
        self.holds = Holds()
        """Variants requests in flight keep from GC until they answered (see ``holds``)."""
        self.owner_uid = root_owner(layout.root) if owner_uid is None else owner_uid
        """Every file of the store must belong to this uid: the owner of the root directory
        (layout.py, "Ownership"), so a ``chown -R`` of the store is all a change of owner needs."""
        self._writer = writer = PublishedIndexWriter(state)
        self._space = space = Space(state)
        self._collector = collector = Collector(state, space, self.holds, writer.publish)
        if auto_gc:
            space.make_room = lambda n: collector.collect(dry_run=False, extra_bytes=n)
        self._names = names = Names(state, writer)
        self._signatures = Signatures(state, writer, names.resolve_revision)
        self._ingest = Ingest(state, space)
        self._leases = LeaseManager(state)
        self._publisher = Publisher(
            state,
            space=space,
            names=names,
            signatures=self._signatures,
            writer=writer,
            move_to_trash=collector.move_to_trash,
            require_metadata_digest=require_metadata_digest,
            use_hardlinks=use_hardlinks,
        )
        self._lookups = Lookups(state, names, self._signatures, self._leases)
        self._quarantine = Quarantine(state, self._ingest, self._publisher)
        self._repairer = Repairer(
            state,
            quarantine=self._quarantine,
            collector=collector,
            writer=writer,
            owner_uid=self.owner_uid,
        )

    @property
    def policy(self) -> gc_mod.GcPolicy:
        """The GC policy; callers replace it for one collection with a target."""
        return self._state.policy

    @policy.setter
    def policy(self, policy: gc_mod.GcPolicy) -> None:
        self._state.policy = policy

    @property
    def provenance(self) -> ProvenanceCheck | None:
        """Who signed a variant, checked once per new tree at publish (``[provenance]``; the
        daemon installs kerneld.pipeline.provenance.SigstoreCheck). None: no check, nothing
        recorded."""
        return self._state.check

    @provenance.setter
    def provenance(self, check: ProvenanceCheck | None) -> None:
        self._state.check = check

    @property
    def generation(self) -> int:
        """The published index generation (``PublishedIndexWriter.generation``)."""
        return self._writer.generation

    @property
    def quarantine_max_bytes(self) -> int:
        """The quarantine's bound (``[store] quarantine_max``, 0: none), checked on each add."""
        return self._quarantine.max_bytes

    @quarantine_max_bytes.setter
    def quarantine_max_bytes(self, value: int) -> None:
        self._quarantine.max_bytes = value

    # ---- opening and closing ----

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        cap_bytes: int | None = None,
        min_free_bytes: int = 0,
        free_target_bytes: int | None = None,
        target_fraction: float = 0.9,
        min_age_s: float = 3600.0,
        orphan_grace_s: float = 3600.0,
        partial_grace_s: float = 24 * 3600.0,
        read_only: bool = False,
        require_metadata_digest: bool = False,
        use_hardlinks: bool = True,
        auto_gc: bool = True,
        client_platforms: Iterable[PlatformFacts] = (),
    ) -> Store:
        """Open (creating if needed) the store at ``root``. Read-write opens take the owner
        lock first (``StoreLockedError`` names the holder's pid), then undo what a crash left.
        ``read_only`` takes no lock and changes nothing (offline tools: exact on a stopped
        store; beside a daemon a tree GC deletes meanwhile can show up as missing)."""
        layout = Layout(Path(root))
        policy = gc_mod.GcPolicy(
            cap_bytes=cap_bytes,
            min_free_bytes=min_free_bytes,
            free_target_bytes=free_target_bytes,
            target_fraction=target_fraction,
            min_age_s=min_age_s,
            orphan_grace_s=orphan_grace_s,
        )
        options = {
            "require_metadata_digest": require_metadata_digest,
            "use_hardlinks": use_hardlinks,
            "auto_gc": auto_gc,
            "partial_grace_s": partial_grace_s,
        }
        if read_only:
            index = Index(layout.db, read_only=True)
            return cls(layout, index, None, policy, **options)  # type: ignore[arg-type]
        owner, index, uid = take_ownership(layout)
        try:
            store = cls(layout, index, owner, policy, owner_uid=uid, **options)  # type: ignore[arg-type]
            store._state.picker = Picker(client_platforms)  # before recovery republishes
            with opening_step("clean up after the last run", layout.root, layout.root):
                recover(
                    store._state, store._collector, store._writer, partial_grace_s=partial_grace_s
                )
        except BaseException:
            index.close()
            owner.release()
            raise
        log.info("opened store %s (pid %d)", layout.root, os.getpid())
        return store

    def close(self) -> None:
        with self._state.lock:
            if self._state.closed:
                return
            self._state.closed = True
            self.index.close()
            if self._owner is not None:
                self._owner.release()
        log.info("closed store %s", self.layout.root)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- blobs (ingest) ----

    def has_blob(self, sha256: str) -> bool:
        """True if the blob is present. A hit also claims it: GC leaves it alone for
        ``orphan_grace_s``, so the fetcher can skip the download and publish with it."""
        return self._ingest.find_blob(sha256=sha256) is not None

    def find_blob(
        self, *, sha256: str | None = None, git_sha1: str | None = None
    ) -> BlobInfo | None:
        """The live blob with this sha256, or (for plain git files) this git blob sha1."""
        return self._ingest.find_blob(sha256=sha256, git_sha1=git_sha1)

    def open_blob(self, sha256: str) -> BinaryIO:
        """A live blob's bytes (FileNotFoundError: not in the store, or collected meanwhile)."""
        return self._ingest.open_blob(sha256)

    def open_writer(self, expected: Expected, **ctx: str | None) -> BlobWriter:
        """A resumable writer for one file, its space reserved (see `Ingest.open_writer`)."""
        return self._ingest.open_writer(expected, **ctx)

    def ingest(
        self,
        source: bytes | Iterable[bytes] | BinaryIO,
        *,
        size: int,
        sha256: str | None = None,
        git_sha1: str | None = None,
        **ctx: str | None,
    ) -> BlobInfo:
        """Ingest a whole file (bytes, chunks or a file object); a present blob is not read."""
        return self._ingest.ingest(source, size=size, sha256=sha256, git_sha1=git_sha1, **ctx)

    def ingest_file(
        self,
        path: str | os.PathLike[str],
        *,
        sha256: str | None = None,
        git_sha1: str | None = None,
        size: int | None = None,
        **ctx: str | None,
    ) -> BlobInfo:
        """Ingest a local file (mirror import). Symlinks, devices and fifos are rejected."""
        return self._ingest.ingest_file(path, sha256=sha256, git_sha1=git_sha1, size=size, **ctx)

    def usage(self) -> Usage:
        return self._space.usage()

    # ---- trees (publishing, provenance) ----

    def publish_tree(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> TreeInfo:
        """Materialise a variant folder from ingested blobs and publish it atomically."""
        return self._publisher.publish_tree(repo, commit, variant, files)

    def check_metadata(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> VariantMetadata:
        """The metadata.json checks `publish_tree` makes, on blobs already ingested, before
        anything is published (a mirror import refuses a kernel whole)."""
        return self._publisher.check_files_metadata(repo, commit, variant, files)

    def set_provenance(self, check: ProvenanceCheck | None) -> None:
        """Install the ingest check (see ``provenance``) and republish the published index, which
        leaves out unverified trees while signatures are required."""
        self._signatures.install(check)

    def set_client_platforms(self, platforms: Iterable[PlatformFacts]) -> None:
        """Publish each platform's pick (``picks.py``); the index is rewritten if they changed."""
        self._writer.set_platforms(platforms)

    def provenance_of(self, digest: str) -> ProvenanceRecord | None:
        """The ingest check's record for a tree (``sha256:<hex>`` or hex); None: not checked."""
        return self._signatures.record_of(digest)

    # ---- resolution ----

    def resolve_revision(self, repo: str, revision: str) -> str | None:
        """A ref known to the index -> its commit; a 40-hex revision -> itself; else None."""
        return self._names.resolve_revision(repo, revision)

    def lookup(
        self,
        repo: str,
        revision: str,
        variant: str,
        *,
        lease_ttl_s: float | None = None,
        holder: str = "",
    ) -> LookupHit | None:
        """Map (repo, ref-or-commit, variant) to a published tree; None if not in the store.

        Raises :class:`DeniedError` for denied repos/revisions. Records the resolve time (LRU)
        and, with ``lease_ttl_s``, takes a lease that keeps the tree from GC until it expires.
        """
        return self._lookups.lookup(repo, revision, variant, lease_ttl_s=lease_ttl_s, holder=holder)

    def published_files(
        self, repo: str, commit: str, variant: str
    ) -> tuple[Path, list[PublishedFile]] | None:
        """(tree path, files) of a published variant; gated as `lookup` (`Lookups`)."""
        return self._lookups.published_files(repo, commit, variant)

    def published_listing(self, repo: str, commit: str, variant: str) -> list[PublishedFile] | None:
        """The files of a published variant, no path (`Lookups.published_listing`)."""
        return self._lookups.published_listing(repo, commit, variant)

    def refs_of(self, repo: str) -> list[RefRow]:
        """Every ref of `repo` this store has recorded (what it can answer without upstreams)."""
        return self.index.refs_of(repo)

    # ---- reading what the store holds (the daemon's listings, the CLI, mirrors) ----
    # Callers outside the store use these, never ``store.index`` or ``store.layout``: the SQL
    # and the on-disk layout stay the store's to change.

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def published_index_dir(self) -> Path:
        """Where the published index lives (``index/v1``), for the status RPC."""
        return self.layout.published_index

    def tree_path(self, digest: str) -> Path:
        """The folder of a tree (``sha256:<hex>`` or hex), whether or not it is live."""
        return self.layout.tree_path(tree_hex(digest))

    @contextlib.contextmanager
    def scratch_file(self, name: str) -> Iterator[Path]:
        """A new private file in the store's work area (its file system, so the space checks
        see it), removed at exit, or at the next open after a crash (an uploaded bundle)."""
        path = self.layout.staging / f"{name}-{secrets.token_hex(8)}"
        path.touch(mode=0o600, exist_ok=False)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def owner_is_running(self) -> bool:
        """Does a live process hold the store's owner lock (a daemon, or a CLI writing)?"""
        return owner_is_running(self.layout.owner_lock)

    def repos(self) -> list[str]:
        """Every repo with a variant, a ref or a deny in the store."""
        return self.index.repos()

    def all_refs(self) -> list[RefRow]:
        return self.index.all_refs()

    def variants_of(self, repo: str, commit: str | None = None) -> list[VariantRow]:
        """The published variants of `repo` (of one commit), live trees or not."""
        return self.index.variants_of(repo, commit)

    def variants_of_tree(self, digest: str) -> list[VariantRow]:
        """Every (repo, commit, variant) that publishes this tree."""
        return self.index.variants_of_tree(tree_hex(digest))

    def tree(self, digest: str) -> TreeRow | None:
        """A tree's row (any state; None: unknown)."""
        return self.index.get_tree(tree_hex(digest))

    def published_tree(self, repo: str, commit: str, variant: str) -> TreeRow | None:
        """The live tree `repo`@`commit` publishes as `variant` (None: not in the store)."""
        return self._lookups.published_tree(repo, commit, variant)

    def variants(self, repo: str, commit: str) -> list[str]:
        """Published variant names of a commit."""
        return [v.variant for v in self.index.variants_of(repo, commit)]

    def upstream_ids(self, repo: str, commit: str, variant: str) -> dict[str, str]:
        """The ids the upstream announced for each file (LFS sha256 or git blob sha1)."""
        return self.index.upstream_ids(repo, commit, variant)

    # ---- names: refs, upstream facts, negative cache, pins, denies ----

    def set_ref(
        self,
        repo: str,
        ref: str,
        commit: str,
        *,
        fetched_at: float | None = None,
        versions: Iterable[int] | None = None,
    ) -> None:
        """Record where `ref` points; `versions` is every `vN` the same upstream listing had
        (published so clients can say, as `kernels` does, that a newer version exists)."""
        self._names.set_ref(repo, ref, commit, fetched_at=fetched_at, versions=versions)

    def upstream_versions(self, repo: str) -> list[int] | None:
        """Every `vN` of the last upstream refs listing recorded with `set_ref`, or None."""
        return self.index.upstream_versions(repo)

    def get_ref(self, repo: str, ref: str) -> RefRow | None:
        """The recorded ref with its fetch time (for TTL and serve-stale decisions)."""
        return self._names.get_ref(repo, ref)

    def set_upstream_variants(self, repo: str, commit: str, names: Iterable[str]) -> None:
        """Record every variant the upstream has for this commit (published in the client
        index, so a client knows whether a better variant than the cached ones exists)."""
        self._names.set_upstream_variants(repo, commit, names)

    def upstream_variants(self, repo: str, commit: str) -> list[str] | None:
        """Every variant the upstream listed for this commit, or None if never recorded."""
        return self.index.get_upstream_variants(repo, commit)

    def put_negative(
        self, repo: str, revision: str, variant: str, reason: str, ttl_s: float
    ) -> None:
        """Remember a failed lookup upstream (no such repo/revision/variant) for ``ttl_s``."""
        self._names.put_negative(repo, revision, variant, reason, ttl_s)

    def get_negative(self, repo: str, revision: str, variant: str = ALL) -> NegativeRow | None:
        return self._names.get_negative(repo, revision, variant)

    def pin(self, repo: str, revision: str = ALL, variant: str = ALL) -> None:
        """Make trees of ``repo`` (``revision`` ref/commit or all, ``variant`` or all) GC roots."""
        self._names.pin(repo, revision, variant)

    def unpin(self, repo: str, revision: str = ALL, variant: str = ALL) -> bool:
        return self._names.unpin(repo, revision, variant)

    def pins(self) -> list[PinRow]:
        return self._names.pins()

    def deny(self, repo: str, revision: str = ALL, reason: str = "") -> None:
        """Refuse ``repo`` (or one ref/commit of it) from now on; published to clients."""
        self._names.deny(repo, revision, reason)

    def allow(self, repo: str, revision: str = ALL) -> bool:
        return self._names.allow(repo, revision)

    def denies(self, repo: str | None = None) -> list[DenyRow]:
        return self._names.denies(repo)

    def check_denied(self, repo: str, revision: str, commit: str | None = None) -> None:
        """Raise :class:`DeniedError` if ``repo`` (or this revision/commit of it) is denied
        (resolution calls this before any upstream I/O: a denied kernel is never fetched)."""
        self._names.check_denied(repo, revision, commit)

    # ---- leases ----

    def acquire_lease(self, tree: str, ttl_s: float, *, holder: str = "") -> Lease:
        """Keep a live tree from GC for ``ttl_s`` seconds."""
        return self._leases.acquire(tree, ttl_s, holder=holder)

    def record_leases(
        self,
        leases: Sequence[Lease],
        *,
        resolved: Iterable[tuple[str, float]] = (),
        per_holder: int = 0,
        total: int = 0,
    ) -> int:
        """Record leases granted ahead of the write, in one transaction, with the resolve
        times of trees served from memory; how many were recorded (see `LeaseManager.record`)."""
        return self._leases.record(leases, resolved=resolved, per_holder=per_holder, total=total)

    def renew_lease(self, lease_id: str, ttl_s: float) -> Lease:
        return self._leases.renew(lease_id, ttl_s)

    def release_lease(self, lease_id: str) -> bool:
        return self._leases.release(lease_id)

    def leases(self) -> list[LeaseRow]:
        return self.index.leases()

    # ---- garbage collection ----

    def gc(self, *, dry_run: bool = False) -> gc_mod.GcReport:
        """Collect garbage and, under pressure, evict least-recently-resolved trees.

        ``dry_run`` reports what would be freed and why each tree is kept, changing nothing.
        """
        if not dry_run:
            self._state.writable()
        return self._collector.collect(dry_run=dry_run, extra_bytes=0)

    def guard_from_gc(self, trees: Callable[[], Iterable[str]]) -> None:
        """Let GC ask ``trees()`` (digests, ``sha256:`` or bare hex) for trees to keep: leases
        the daemon granted but has not written yet. It is called under the store lock, so it
        must not call back into the store."""
        self._collector.guard(trees)

    # ---- verification and quarantine ----

    def verify(
        self,
        *,
        repair: bool = False,
        on_invalidated: Callable[[str, str, str], None] | None = None,
    ) -> verify_mod.VerifyReport:
        """Re-hash every blob and tree; ``repair`` quarantines what is broken (`Repairer`)."""
        return self._repairer.verify(repair=repair, on_invalidated=on_invalidated)

    def invalidate(
        self,
        *,
        trees: Iterable[str] = (),
        blobs: Iterable[str] = (),
        problems: Sequence[verify_mod.Problem] = (),
    ) -> tuple[Invalidated, set[str], list[verify_mod.Quarantined]]:
        """Take damaged trees and blobs out of service at once (the scrub's repair); the
        invalidated (repo, commit, variant), the dead tree digests and the quarantine entries
        (see `Repairer.invalidate`)."""
        return self._repairer.invalidate(trees=trees, blobs=blobs, problems=problems)

    def quarantine(self) -> list[verify_mod.Quarantined]:
        """Every quarantine entry, oldest first."""
        return self._quarantine.entries()

    def prune_quarantine(self) -> list[verify_mod.Quarantined]:
        """Drop entries that are served again (replaced by a re-fetch); the dropped ones."""
        return self._quarantine.prune()

    def drop_quarantined(self, name: str) -> verify_mod.Quarantined:
        """Delete one quarantine entry for good (an admin decided it is not needed)."""
        return self._quarantine.drop(name)

    def restore_quarantined(self, name: str) -> list[TreeInfo]:
        """Put a quarantined tree (or blob) back into service, re-hashed like a mirror import."""
        return self._quarantine.restore(name)

    def quarantine_count(self) -> int:
        """Entries in the quarantine, without reading them (the status line, every few s)."""
        return self._quarantine.count()

    def quarantine_usage(self) -> tuple[int, int]:
        """(entries, bytes they hold) of the quarantine: what status and metrics show."""
        return self._quarantine.usage()

    def annotate_quarantined(self, name: str, extra: dict[str, Any]) -> verify_mod.Quarantined:
        """Add ``extra`` to an entry's entry.json (who reported the damage, and why)."""
        return self._quarantine.annotate(name, extra)

    def live_tree_digests(self) -> list[str]:
        """Hex digests of every live tree, sorted (the scrub walks them in this order)."""
        return self.index.tree_digests("live")

    # ---- store-level facts and documents ----

    def mark_as_cache(self) -> None:
        """Write `CACHEDIR.TAG` into the root (once): a user-mode store under ~/.cache is a
        cache that backups should skip, everything in it can be fetched again."""
        if not self.read_only:
            write_cachedir_tag(self.layout.cachedir_tag)

    def get_meta(self, key: str) -> str | None:
        return self.index.get_meta(key)

    def set_meta(self, key: str, value: str | None) -> None:
        """Set (or with None delete) a small store-level fact, e.g. when the scrub last ran."""
        self._state.writable()
        with self._state.lock, self.index.tx() as conn:
            if value is None:
                self.index.delete_meta(conn, key)
            else:
                self.index.set_meta(conn, key, value)

    def publish_document(self, name: str, doc: dict[str, Any]) -> None:
        """Write a store-wide document next to the published index (`index/v1/<name>`), for
        readers of the warm path; unchanged content is not rewritten."""
        self._writer.publish_document(name, doc)

    def read_document(self, name: str) -> dict[str, Any] | None:
        """A document `publish_document` wrote (None if missing or unreadable)."""
        return self._writer.read_document(name)
