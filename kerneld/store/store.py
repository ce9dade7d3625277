"""The :class:`Store` facade: one object that owns a store directory.

Typical daemon use::

    store = Store.open(root, cap_bytes=20 << 30, min_free_bytes=1 << 30)
    if not store.has_blob(sha256):
        with store.open_writer(Expected(size, sha256=sha256)) as w:   # resumable
            for chunk in http_get(url, start=w.offset):
                w.write(chunk)
            w.commit()
    store.publish_tree(repo, commit, variant, [TreeFile(path, sha256, size), ...])
    store.set_ref(repo, "v1", commit)
    hit = store.lookup(repo, "v1", variant, lease_ttl_s=600)

Thread-safe: every index access and every rename into or out of ``blobs/``/``trees/`` happens
under one in-process lock; hashing, downloads, staging builds and file deletion happen outside it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from . import client_index, faults
from . import gc as gc_mod
from . import verify as verify_mod
from .blobs import BlobInfo, BlobWriter, Expected
from .errors import (
    BlobMissingError,
    DeniedError,
    InvalidInputError,
    LeaseNotFoundError,
    MetadataError,
    ProvenanceError,
    ReadOnlyStoreError,
    ResourceExhaustedError,
    SizeMismatchError,
    StoreError,
    StoreOwnershipError,
    TreeNotFoundError,
    UnsupportedFileTypeError,
)
from .holds import Holds
from .index import (
    ALL,
    DenyRow,
    Index,
    LeaseRow,
    NegativeRow,
    PinRow,
    ProvenanceRecord,
    RefRow,
    TreeRow,
    VariantRow,
)
from .layout import DIR_MODE_PRIVATE, DIR_MODE_PUBLIC, Layout, check_root, fsync_dir, user_name
from .locks import OwnerLock, Probe, create_tree_lock, is_held, owner_is_running
from .manifest import (
    METADATA_FILE,
    ManifestEntry,
    TreeFile,
    VariantMetadata,
    canonical_manifest,
    check_metadata_digest,
    parse_manifest,
    parse_metadata,
    sort_entries,
    tree_digest,
)
from .paths import (
    check_unique_paths,
    normalize_mode,
    validate_commit,
    validate_hex,
    validate_ref,
    validate_relpath,
    validate_repo,
    validate_variant,
)
from .trees import build_staging, remove_tree, seal_top, unseal_top

log = logging.getLogger("kerneld.store")

READ_CHUNK = 1 << 20


class ProvenanceCheck(Protocol):
    """The ingest check a daemon installs (``Store.provenance``): who signed a variant.

    The store stays free of any signing scheme; it hands over a variant's files by path, once
    per new tree, after the files and the metadata digest have been verified.
    """

    @property
    def required(self) -> bool:
        """Refuse (ProvenanceError) every tree that is not "verified"?"""
        ...

    def check(
        self, read: Callable[[str], bytes | None], *, digest_checked: bool, **ctx: str | None
    ) -> ProvenanceRecord:
        """The record for one variant: `read(path)` gives a file's bytes (None: no such file);
        `digest_checked` says metadata.json's digest was there and matched every file."""
        ...


@dataclass(frozen=True)
class Lease:
    id: str
    tree: str
    """Tree digest, ``sha256:<hex>``."""
    expires_at: float
    holder: str = ""


@dataclass(frozen=True)
class TreeInfo:
    repo: str
    commit: str
    variant: str
    digest: str
    """``sha256:<hex>`` of the canonical manifest."""
    path: Path
    lock_path: Path
    size: int
    files: int
    created: bool
    """False when an identical tree already existed (dedupe across revisions and repos)."""
    metadata: VariantMetadata
    metadata_digest_checked: bool
    provenance: ProvenanceRecord | None = None
    """Who signed the tree, as checked at ingest (None: the daemon checks no signatures)."""


@dataclass(frozen=True)
class LookupHit:
    """A published tree `Store.lookup` found for (repo, revision, variant)."""

    repo: str
    commit: str
    variant: str
    digest: str
    path: Path
    lock_path: Path
    metadata_id: str | None
    backend: str | None
    archs: list[str]
    lease: Lease | None = None


@dataclass(frozen=True)
class PublishedFile:
    """One file of a published variant: its manifest line and the upstream's id for it (an
    LFS sha256 or a git blob sha1; None for a tree that came without one, a mirror import)."""

    path: str
    size: int
    sha256: str
    mode: int
    upstream_id: str | None


@dataclass(frozen=True)
class Usage:
    bytes_used: int
    bytes_reserved: int
    cap_bytes: int | None
    free_bytes: int
    min_free_bytes: int
    blobs: int
    trees: int


@dataclass(frozen=True)
class _Publish:
    """Everything one publish_tree call has established before touching the disk."""

    repo: str
    commit: str
    variant: str
    hexd: str
    entries: list[ManifestEntry]
    upstream_ids: Sequence[tuple[str, str | None]]
    meta: VariantMetadata
    checked: bool
    provenance: ProvenanceRecord | None = None
    """The ingest check's answer, to record with the tree (None: no check installed)."""


#: Why a tree without a provenance record is refused while signatures are required.
_UNCHECKED = ("unchecked", "its signature was never checked")


def _hex(digest: str) -> str:
    """Accept ``sha256:<hex>`` or bare hex for a tree digest."""
    value = digest.removeprefix("sha256:")
    return validate_hex(value, 64, "tree digest")


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
        self.policy = policy
        self.read_only = owner is None
        self.require_metadata_digest = require_metadata_digest
        self.use_hardlinks = use_hardlinks
        self.auto_gc = auto_gc
        self.partial_grace_s = partial_grace_s
        self._owner = owner
        self._lock = threading.RLock()
        self._reserved = 0
        self._closed = False
        self.quarantine_max_bytes = verify_mod.DEFAULT_QUARANTINE_MAX_BYTES
        """The quarantine's bound (``[store] quarantine_max``; the daemon sets it from its
        config, 0: none). Checked whenever an entry is added (`_bound_quarantine`)."""
        self.holds = Holds()
        """Variants requests in flight keep from GC until they answered (see ``holds``)."""
        self._gc_guards: list[Callable[[], Iterable[str]]] = []
        self.provenance: ProvenanceCheck | None = None
        """Who signed a variant, checked once per new tree at publish (``[provenance]``; the
        daemon installs kerneld.provenance.SigstoreCheck). None: no check, nothing recorded."""
        self.generation = int(index.get_meta("generation") or 0)
        """The client index generation: bumped by every change a resolution depends on (refs,
        variants, denies, GC, repair), so the daemon can tell cheaply whether anything moved."""
        self.owner_uid = _root_owner(layout.root) if owner_uid is None else owner_uid
        """Every file of the store must belong to this uid: the owner of the root directory
        (layout.py, "Ownership"), so a ``chown -R`` of the store is all a change of owner needs."""

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
    ) -> Store:
        """Open (creating if needed) the store at ``root``.

        Read-write opens take the exclusive owner lock first (``StoreLockedError`` names the
        holder's pid) and then clean up whatever an earlier crash left behind. ``read_only``
        takes no lock and changes nothing: for offline tools such as ``kerneldctl verify``.
        It is exact on a stopped store; next to a running daemon a tree that GC deletes during
        the run can show up as missing (``locks.owner_is_running`` tells the two cases apart),
        so repairs always go through a read-write open, i.e. the owner.
        """
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
        uid = check_root(layout.root)
        with _step("create the store directory", layout.root, layout.root):
            layout.root.mkdir(mode=DIR_MODE_PUBLIC, parents=True, exist_ok=True)
        with _step("take the owner lock", layout.owner_lock, layout.root):
            owner = OwnerLock(layout.owner_lock)
        try:
            with _step("create the store's directories", layout.base, layout.root):
                layout.ensure()
            with _step("open the index", layout.db, layout.root):
                index = Index(layout.db)
            try:
                _record_owner(index, uid)
                store = cls(
                    layout,
                    index,
                    owner,
                    policy,
                    owner_uid=uid,
                    **options,  # type: ignore[arg-type]
                )
                with _step("clean up after the last run", layout.root, layout.root):
                    store._recover()
            except BaseException:
                index.close()
                raise
        except BaseException:
            owner.release()
            raise
        log.info("opened store %s (pid %d)", layout.root, os.getpid())
        return store

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.index.close()
            if self._owner is not None:
                self._owner.release()
        log.info("closed store %s", self.layout.root)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(
                "the store was opened read-only; open it read-write (as its owner, with the "
                "daemon stopped) to change it"
            )
        if self._closed:
            raise ReadOnlyStoreError("the store is closed")

    # ---- crash recovery ----

    def _recover(self) -> None:
        """Finish or undo whatever an interrupted process left (runs at every read-write open)."""
        lay = self.layout
        for child in list(lay.staging.iterdir()):
            remove_tree(child)
        self._empty_trash()
        now = time.time()
        for part in list(lay.ingest.iterdir()):
            try:
                if part.stat().st_mtime < now - self.partial_grace_s:
                    part.unlink()
                    log.info("removed stale partial download %s", part.name)
            except FileNotFoundError:
                pass
        client_index.clean_temporaries(lay)
        with self._lock:
            for blob in self.index.blobs("pending"):
                lay.blob_path(blob.sha256).unlink(missing_ok=True)
                with self.index.tx() as conn:
                    self.index.delete_blob(conn, blob.sha256)
                log.info("recovery: dropped unfinished blob %s", blob.sha256)
            for tree in self.index.trees("pending"):
                self._move_to_trash(lay.tree_path(tree.digest))
                with self.index.tx() as conn:
                    self.index.delete_tree(conn, tree.digest)
                log.info("recovery: dropped unfinished tree %s", tree.digest)
            for tree in self.index.trees("dead"):
                if is_held(lay.lock_path(tree.digest)):
                    # A client found it through a stale client index: keep it alive for now
                    # (unreferenced, so the next GC collects it once the client is gone).
                    with self.index.tx() as conn:
                        self.index.set_tree_state(conn, tree.digest, "live")
                        for _path, sha in self.index.tree_blobs(tree.digest):
                            self.index.set_blob_state(conn, sha, "live")
                    log.info("recovery: tree %s is in use, kept", tree.digest)
        self._purge_dead({})
        with self._lock:
            live = set(self.index.tree_digests("live"))
            for lock_file in list(lay.locks.iterdir()):
                name = lock_file.name.removesuffix(".lock")
                if name not in live and not is_held(lock_file):
                    lock_file.unlink(missing_ok=True)
            self._rebuild_client_index()
        self._empty_trash()

    def _rebuild_client_index(self) -> None:
        repos = set(self.index.repos())
        base = self.layout.client_index
        for org_dir in list(base.iterdir()) if base.is_dir() else []:
            if not org_dir.is_dir():
                continue
            for f in list(org_dir.iterdir()):
                if f.suffix == ".json" and f"{org_dir.name}/{f.stem}" not in repos:
                    client_index.remove(f)
        self._publish_index(repos, denies=True, skip_unchanged=True)

    # ---- blobs ----

    def has_blob(self, sha256: str) -> bool:
        """True if the blob is present. A hit also claims it: GC leaves it alone for
        ``orphan_grace_s``, so the fetcher can skip the download and publish with it."""
        return self.find_blob(sha256=sha256) is not None

    def find_blob(
        self, *, sha256: str | None = None, git_sha1: str | None = None
    ) -> BlobInfo | None:
        """The live blob with this sha256, or (for plain git files) this git blob sha1."""
        with self._lock:
            row = None
            if sha256 is not None:
                row = self.index.get_blob(sha256)
            elif git_sha1 is not None:
                row = self.index.find_blob_by_git_sha1(git_sha1)
            if row is None or row.state != "live":
                return None
            if not self.read_only:
                self.index.claim_blob(row.sha256, time.time())
            return BlobInfo(row.sha256, row.size, row.git_sha1, created=False)

    def open_blob(self, sha256: str) -> BinaryIO:
        """A live blob's bytes (FileNotFoundError: not in the store, or collected meanwhile)."""
        return self.layout.blob_path(sha256).open("rb")

    def open_writer(self, expected: Expected, **ctx: str | None) -> BlobWriter:
        """A resumable writer for one file; ``writer.offset`` says where to continue.

        Space for ``expected.size`` bytes is reserved now (``ResourceExhaustedError`` if it does
        not fit even after GC) and released when the writer commits, aborts or closes.
        """
        self._writable()
        self._reserve(expected.size, ctx)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._unreserve(expected.size)

        try:
            return BlobWriter(
                self.layout.partial_path(*expected.key),
                expected,
                lambda part, info: self._commit_blob(part, info, ctx),
                on_close=release,
                context=dict(ctx),
            )
        except BaseException:
            release()
            raise

    def ingest(
        self,
        source: bytes | Iterable[bytes] | BinaryIO,
        *,
        size: int,
        sha256: str | None = None,
        git_sha1: str | None = None,
        **ctx: str | None,
    ) -> BlobInfo:
        """Ingest a whole file from bytes, an iterable of chunks or a binary file object.

        If the blob is already present nothing is read (``created=False``).
        """
        expected = Expected(size, sha256=sha256, git_sha1=git_sha1)
        found = self.find_blob(sha256=sha256, git_sha1=git_sha1 if sha256 is None else None)
        if found is not None and (git_sha1 is None or found.git_sha1 in (None, git_sha1)):
            return found
        with self.open_writer(expected, **ctx) as writer:
            skip = writer.offset
            for piece in _chunks(source):
                chunk = piece
                if skip:
                    if len(chunk) <= skip:
                        skip -= len(chunk)
                        continue
                    chunk, skip = chunk[skip:], 0
                writer.write(chunk)
            return writer.commit()

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
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if os.path.islink(path):
                raise UnsupportedFileTypeError(
                    "refusing to ingest a symlink", path=os.fspath(path), **ctx
                ) from exc
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsupportedFileTypeError(
                    "refusing to ingest something that is not a regular file",
                    path=os.fspath(path),
                    **ctx,
                )
            if size is not None and size != st.st_size:
                raise SizeMismatchError(size, st.st_size, path=os.fspath(path), **ctx)
            return self.ingest(f, size=st.st_size, sha256=sha256, git_sha1=git_sha1, **ctx)

    def _commit_blob(self, part: Path, info: BlobInfo, ctx: dict[str, str | None]) -> BlobInfo:
        final = self.layout.blob_path(info.sha256)
        with self._lock:
            self._writable()
            row = self.index.get_blob(info.sha256)
            if row is not None and row.state == "live" and final.exists():
                part.unlink(missing_ok=True)
                self.index.claim_blob(info.sha256, time.time())
                if info.git_sha1 and row.git_sha1 is None:
                    with self.index.tx() as conn:
                        self.index.put_blob(conn, info.sha256, info.size, info.git_sha1, "live")
                log.info("blob %s already present (%s)", info.sha256, _fmt(ctx))
                return replace(info, created=False)
            with self.index.tx() as conn:
                self.index.put_blob(conn, info.sha256, info.size, info.git_sha1, "pending")
            faults.point("blob.pending")
            bucket = final.parent
            if not bucket.is_dir():
                bucket.mkdir(mode=DIR_MODE_PUBLIC, exist_ok=True)
                os.chmod(bucket, DIR_MODE_PUBLIC)
                fsync_dir(bucket.parent)
            os.replace(part, final)
            faults.point("blob.renamed")
            fsync_dir(bucket)
            with self.index.tx() as conn:
                self.index.set_blob_state(conn, info.sha256, "live")
            faults.point("blob.live")
        log.info("ingested blob %s (%d bytes) %s", info.sha256, info.size, _fmt(ctx))
        return info

    # ---- space ----

    def _free_bytes(self) -> int:
        st = os.statvfs(self.layout.base)
        return st.f_bavail * st.f_frsize

    def _reserve(self, n: int, ctx: dict[str, str | None]) -> None:
        with self._lock:
            for attempt in (0, 1):
                used = self.index.usage() + self._reserved
                cap = self.policy.cap_bytes
                free = self._free_bytes() - self._reserved
                over_cap = cap is not None and used + n > cap
                low_free = free - n < self.policy.min_free_bytes
                if not over_cap and not low_free:
                    self._reserved += n
                    return
                if attempt == 0 and self.auto_gc:
                    log.info("reserving %d bytes needs space: running GC", n)
                    self._gc(dry_run=False, extra_bytes=n)
                    continue
                if over_cap:
                    assert cap is not None
                    raise ResourceExhaustedError(n, max(0, cap - used), "size cap", **ctx)
                raise ResourceExhaustedError(
                    n, max(0, free - self.policy.min_free_bytes), "free-space watermark", **ctx
                )

    def _unreserve(self, n: int) -> None:
        with self._lock:
            self._reserved = max(0, self._reserved - n)

    def usage(self) -> Usage:
        with self._lock:
            return Usage(
                bytes_used=self.index.usage(),
                bytes_reserved=self._reserved,
                cap_bytes=self.policy.cap_bytes,
                free_bytes=self._free_bytes(),
                min_free_bytes=self.policy.min_free_bytes,
                blobs=self.index.count("blobs", "live"),
                trees=self.index.count("trees", "live"),
            )

    # ---- trees ----

    def publish_tree(
        self,
        repo: str,
        commit: str,
        variant: str,
        files: Iterable[TreeFile],
    ) -> TreeInfo:
        """Materialise a variant folder from ingested blobs and publish it atomically.

        Paths and modes are validated, ``metadata.json`` must be present and its ``digest`` (if
        any; mandatory with ``require_metadata_digest``) must describe exactly the other files.
        The tree is built in a staging directory, renamed into ``trees/`` and only then made
        valid by the index row; the client index of ``repo`` is rewritten last.
        """
        self._writable()
        validate_repo(repo)
        ctx: dict[str, str | None] = {"repo": repo}
        validate_commit(commit, **ctx)
        ctx["commit"] = commit
        validate_variant(variant, **ctx)
        ctx["variant"] = variant
        self._check_denied(repo, commit, commit, ctx)

        wanted: list[tuple[str, int, str, int | None, str | None]] = []
        for f in files:
            if not isinstance(f, TreeFile):
                raise InvalidInputError(f"expected TreeFile, got {type(f).__name__}", **ctx)
            path = validate_relpath(f.path, **ctx)
            mode = normalize_mode(f.mode, path, **ctx)
            validate_hex(f.sha256, 64, f"sha256 of {path!r}")
            if f.size is not None and (type(f.size) is not int or f.size < 0):
                raise InvalidInputError(f"invalid size {f.size!r}", path=path, **ctx)
            wanted.append((path, mode, f.sha256, f.size, f.upstream_id))
        check_unique_paths((w[0] for w in wanted), **ctx)
        if not wanted:
            raise InvalidInputError("a variant tree needs at least one file", **ctx)

        entries: list[ManifestEntry] = []
        with self._lock:
            missing = []
            for path, mode, sha, size, _oid in wanted:
                row = self.index.get_blob(sha)
                if row is None or row.state != "live":
                    missing.append(sha)
                    continue
                if size is not None and size != row.size:
                    raise SizeMismatchError(size, row.size, "file size", path=path, **ctx)
                self.index.claim_blob(sha, time.time())  # GC keeps it until we are done
                entries.append(ManifestEntry(path, mode, row.size, sha))
        if missing:
            raise BlobMissingError(missing, **ctx)
        entries = sort_entries(entries)
        by_path = {e.path: e for e in entries}
        digest = tree_digest(entries)
        hexd = digest.removeprefix("sha256:")
        upstream_ids = [(w[0], w[4]) for w in wanted if w[4]]

        meta, checked = self._check_metadata(by_path, ctx)
        provenance = self._check_provenance(hexd, by_path, checked, ctx)
        job = _Publish(
            repo, commit, variant, hexd, entries, upstream_ids, meta, checked, provenance
        )

        with self._lock:
            existing = self.index.get_tree(hexd)
            if existing is not None and existing.state == "live":
                return self._add_variant(job, created=False)

        reserved = 0

        def reserve(n: int) -> None:
            nonlocal reserved
            self._reserve(n, ctx)
            reserved += n

        try:
            staging, copied = build_staging(
                self.layout, entries, reserve=reserve, use_hardlinks=self.use_hardlinks, ctx=ctx
            )
            try:
                faults.point("tree.staged")
                with self._lock:
                    self._writable()
                    existing = self.index.get_tree(hexd)
                    if existing is not None and existing.state == "live":
                        remove_tree(staging)
                        return self._add_variant(job, created=False)
                    self._commit_tree(job, copied, staging, ctx)
                    return self._add_variant(job, created=True)
            finally:
                if staging.exists():
                    remove_tree(staging)
        finally:
            self._unreserve(reserved)

    def check_metadata(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> VariantMetadata:
        """The metadata.json checks `publish_tree` makes (present, parsable, its digest
        matching the files), on blobs already ingested, before anything is published: a mirror
        import refuses a kernel whole rather than publish some of its variants."""
        by_path = {f.path: ManifestEntry(f.path, 0o444, f.size or 0, f.sha256) for f in files}
        meta, _ = self._check_metadata(
            by_path, {"repo": repo, "commit": commit, "variant": variant}
        )
        return meta

    def _check_metadata(
        self, by_path: dict[str, ManifestEntry], ctx: dict[str, str | None]
    ) -> tuple[VariantMetadata, bool]:
        entry = by_path.get(METADATA_FILE)
        if entry is None:
            raise MetadataError(
                "the variant has no metadata.json (it is mandatory in the Kernel Hub format)",
                **ctx,
            )
        if entry.size > (1 << 20):
            raise MetadataError(f"metadata.json is {entry.size} bytes, over 1 MiB", **ctx)
        try:
            raw = self.layout.blob_path(entry.sha256).read_bytes()
        except FileNotFoundError:
            raise BlobMissingError([entry.sha256], path=METADATA_FILE, **ctx) from None
        if hashlib.sha256(raw).hexdigest() != entry.sha256:
            raise BlobMissingError([entry.sha256], path=METADATA_FILE, **ctx)
        doc, meta = parse_metadata(raw, **ctx)

        def hash_file(algorithm: str, path: str) -> bytes:
            h = hashlib.new(algorithm)
            with open(self.layout.blob_path(by_path[path].sha256), "rb") as f:
                while chunk := f.read(READ_CHUNK):
                    h.update(chunk)
            return h.digest()

        checked = check_metadata_digest(
            doc, by_path, hash_file, require=self.require_metadata_digest, **ctx
        )
        if not checked:
            log.warning(
                "metadata.json has no digest; files verified by upstream ids only %s", _fmt(ctx)
            )
        return meta, checked

    def _check_provenance(
        self,
        hexd: str,
        by_path: dict[str, ManifestEntry],
        checked: bool,
        ctx: dict[str, str | None],
    ) -> ProvenanceRecord | None:
        """Who signed this tree: the record a live tree already has, or the installed check's
        answer for a new one (ProvenanceError when the site requires signed kernels)."""
        check = self.provenance
        if check is None:
            return None
        tree = self.index.get_tree(hexd)
        record = self.index.get_provenance(hexd) if tree and tree.state == "live" else None
        if record is None:

            def read(path: str) -> bytes | None:
                entry = by_path.get(path)
                return None if entry is None else self.layout.blob_path(entry.sha256).read_bytes()

            record = check.check(read, digest_checked=checked, **ctx)
        if check.required and not record.verified:
            raise ProvenanceError(record.status, record.detail, **ctx)
        return record

    @property
    def _require_signed(self) -> bool:
        return self.provenance is not None and self.provenance.required

    def set_provenance(self, check: ProvenanceCheck | None) -> None:
        """Install the ingest check (see ``provenance``) and republish the client index, which
        leaves out unverified trees while signatures are required."""
        with self._lock:
            before = self._require_signed
            self.provenance = check
            if self._require_signed != before and not self.read_only:
                self._publish_index(self.index.repos(), skip_unchanged=True)

    def _check_unrecorded(self, repo: str, revision: str, variant: str) -> None:
        """While signatures are required: check a live tree that has no record yet (it entered
        the store while no check was installed, or under an older kerneld), once, from its
        published files. Runs before `lookup` takes the store lock, since the first check
        imports sigstore and may refresh its trust root over the network."""
        check = self.provenance
        commit = self.resolve_revision(repo, revision)
        row = None if commit is None else self.index.get_variant(repo, commit, variant)
        tree = None if row is None else self.index.get_tree(row.tree)
        if check is None or self.read_only or tree is None or tree.state != "live":
            return
        if self.index.get_provenance(tree.digest) is not None:
            return
        folder = self.layout.tree_path(tree.digest)

        def read(path: str) -> bytes | None:
            file = folder / path
            return file.read_bytes() if file.is_file() else None

        # Its metadata digest, if it has one, was checked against the files when it was published.
        try:
            meta = json.loads(read(METADATA_FILE) or b"{}")
        except ValueError:
            meta = {}
        checked = isinstance(meta, dict) and meta.get("digest") is not None
        ctx = {"repo": repo, "commit": commit, "variant": variant}
        record = check.check(read, digest_checked=checked, **ctx)
        with self.index.tx() as conn:
            self.index.put_provenance(conn, tree.digest, record)
        self._publish_index([repo])

    def provenance_of(self, digest: str) -> ProvenanceRecord | None:
        """The ingest check's record for a tree (``sha256:<hex>`` or hex); None: not checked."""
        return self.index.get_provenance(_hex(digest))

    def _commit_tree(
        self, job: _Publish, copied: int, staging: Path, ctx: dict[str, str | None]
    ) -> None:
        """Rename a staged tree into place and record it (caller holds the lock)."""
        hexd, entries, meta = job.hexd, job.entries, job.meta
        missing = [
            e.sha256
            for e in entries
            if (row := self.index.get_blob(e.sha256)) is None or row.state != "live"
        ]
        if missing:
            raise BlobMissingError(missing, **ctx)
        with self.index.tx() as conn:
            self.index.put_tree(
                conn,
                digest=hexd,
                size=sum(e.size for e in entries),
                files=[(e.path, e.sha256) for e in entries],
                copied_bytes=copied,
                manifest=canonical_manifest(entries),
                metadata_id=meta.id,
                backend=meta.backend,
                archs=meta.archs,
                state="pending",
            )
        faults.point("tree.pending")
        create_tree_lock(self.layout.lock_path(hexd))
        target = self.layout.tree_path(hexd)
        if os.path.lexists(target):
            self._move_to_trash(target)
        os.rename(staging, target)
        faults.point("tree.renamed")
        seal_top(target)  # only now: a non-root daemon cannot rename a 0555 directory
        fsync_dir(self.layout.trees)

    def _add_variant(self, job: _Publish, *, created: bool) -> TreeInfo:
        """Make the tree live and point (repo, commit, variant) at it (caller holds the lock)."""
        repo, commit, variant, hexd = job.repo, job.commit, job.variant, job.hexd
        entries, upstream_ids = job.entries, job.upstream_ids
        with self.index.tx() as conn:
            if created:
                self.index.set_tree_state(conn, hexd, "live")
            if job.provenance is not None:
                self.index.put_provenance(conn, hexd, job.provenance)
            self.index.put_variant(
                conn,
                repo=repo,
                commit=commit,
                variant=variant,
                tree=hexd,
                upstream_ids=[(p, oid) for p, oid in upstream_ids if oid],
            )
            self.index.delete_negative_of(conn, repo)
        faults.point("tree.live")
        self._publish_index([repo])
        size = sum(e.size for e in entries)
        log.info(
            "published %s tree sha256:%s (%d files, %d bytes, %s) %s",
            variant,
            hexd,
            len(entries),
            size,
            "new" if created else "deduplicated",
            _fmt({"repo": repo, "commit": commit, "variant": variant}),
        )
        return TreeInfo(
            repo=repo,
            commit=commit,
            variant=variant,
            digest=f"sha256:{hexd}",
            path=self.layout.tree_path(hexd),
            lock_path=self.layout.lock_path(hexd),
            size=size,
            files=len(entries),
            created=created,
            metadata=job.meta,
            metadata_digest_checked=job.checked,
            provenance=job.provenance,
        )

    # ---- resolution ----

    def resolve_revision(self, repo: str, revision: str) -> str | None:
        """A ref known to the index -> its commit; a 40-hex revision -> itself; else None."""
        ref = self.index.get_ref(repo, revision)
        if ref is not None:
            return ref.commit
        if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
            return revision
        return None

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
        validate_repo(repo)
        validate_ref(revision, repo=repo)
        if self._require_signed:
            self._check_unrecorded(repo, revision, variant)  # not under the lock: sigstore
        with self._lock:
            commit = self.resolve_revision(repo, revision)
            self._check_denied(repo, revision, commit, {"repo": repo, "commit": commit})
            if commit is None:
                return None
            row = self.index.get_variant(repo, commit, variant)
            if row is None:
                return None
            tree = self.index.get_tree(row.tree)
            if tree is None or tree.state != "live":
                return None
            if self._require_signed:
                record = self.index.get_provenance(tree.digest)
                if record is None or not record.verified:
                    status, detail = (record.status, record.detail) if record else _UNCHECKED
                    raise ProvenanceError(status, detail, repo=repo, commit=commit, variant=variant)
            now = time.time()
            if not self.read_only:
                self.index.touch_tree(tree.digest, now)
            lease = None
            if lease_ttl_s is not None:
                lease = self.acquire_lease(tree.digest, lease_ttl_s, holder=holder)
            return LookupHit(
                repo=repo,
                commit=commit,
                variant=variant,
                digest=f"sha256:{tree.digest}",
                path=self.layout.tree_path(tree.digest),
                lock_path=self.layout.lock_path(tree.digest),
                metadata_id=tree.metadata_id,
                backend=tree.backend,
                archs=tree.archs,
                lease=lease,
            )

    def published_files(
        self, repo: str, commit: str, variant: str
    ) -> tuple[Path, list[PublishedFile]] | None:
        """(tree path, files) of a published variant, each file with the id its upstream
        announced; None when the variant is not here. The Hub API endpoint lists these."""
        with self._lock:
            row = self.index.get_variant(repo, commit, variant)
            tree = None if row is None else self.index.get_tree(row.tree)
            if row is None or tree is None or tree.state != "live":
                return None
            ids = self.index.upstream_ids(repo, commit, variant)
        files = [
            PublishedFile(e.path, e.size, e.sha256, e.mode, ids.get(e.path))
            for e in parse_manifest(tree.manifest)
        ]
        return self.layout.tree_path(tree.digest), files

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
    def client_index_dir(self) -> Path:
        """Where the published client index lives (``index/v1``), for the status RPC."""
        return self.layout.client_index

    def tree_path(self, digest: str) -> Path:
        """The folder of a tree (``sha256:<hex>`` or hex), whether or not it is live."""
        return self.layout.tree_path(_hex(digest))

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
        return self.index.variants_of_tree(_hex(digest))

    def tree(self, digest: str) -> TreeRow | None:
        """A tree's row (any state; None: unknown)."""
        return self.index.get_tree(_hex(digest))

    def published_tree(self, repo: str, commit: str, variant: str) -> TreeRow | None:
        """The live tree `repo`@`commit` publishes as `variant` (None: not in the store)."""
        row = self.index.get_variant(repo, commit, variant)
        tree = None if row is None else self.index.get_tree(row.tree)
        return tree if tree is not None and tree.state == "live" else None

    def variants(self, repo: str, commit: str) -> list[str]:
        """Published variant names of a commit."""
        return [v.variant for v in self.index.variants_of(repo, commit)]

    def upstream_ids(self, repo: str, commit: str, variant: str) -> dict[str, str]:
        """The ids the upstream announced for each file (LFS sha256 or git blob sha1)."""
        return self.index.upstream_ids(repo, commit, variant)

    # ---- refs, upstream facts, negative cache ----

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
        self._writable()
        validate_repo(repo)
        validate_ref(ref, repo=repo)
        validate_commit(commit, repo=repo)
        listed = None if versions is None else [int(v) for v in versions]
        if listed is not None and any(v < 0 for v in listed):
            raise InvalidInputError(f"versions must be non-negative, got {listed}", repo=repo)
        with self._lock:
            with self.index.tx() as conn:
                self.index.put_ref(conn, repo, ref, commit, fetched_at or time.time())
                if listed is not None:
                    self.index.put_upstream_versions(conn, repo, listed)
            self._publish_index([repo])
        log.info("ref %s -> %s %s", ref, commit, _fmt({"repo": repo}))

    def upstream_versions(self, repo: str) -> list[int] | None:
        """Every `vN` of the last upstream refs listing recorded with `set_ref`, or None."""
        return self.index.upstream_versions(repo)

    def get_ref(self, repo: str, ref: str) -> RefRow | None:
        """The recorded ref with its fetch time (for TTL and serve-stale decisions)."""
        return self.index.get_ref(repo, ref)

    def set_upstream_variants(self, repo: str, commit: str, names: Iterable[str]) -> None:
        """Record every variant the upstream has for this commit (published in the client
        index, so a client knows whether a better variant than the cached ones exists)."""
        self._writable()
        validate_repo(repo)
        validate_commit(commit, repo=repo)
        clean = sorted({validate_variant(n, repo=repo, commit=commit) for n in names})
        with self._lock:
            with self.index.tx() as conn:
                self.index.put_upstream_variants(conn, repo, commit, clean)
            self._publish_index([repo])

    def upstream_variants(self, repo: str, commit: str) -> list[str] | None:
        """Every variant the upstream listed for this commit, or None if never recorded."""
        return self.index.get_upstream_variants(repo, commit)

    def put_negative(
        self, repo: str, revision: str, variant: str, reason: str, ttl_s: float
    ) -> None:
        """Remember a failed lookup upstream (no such repo/revision/variant) for ``ttl_s``."""
        self._writable()
        now = time.time()
        row = NegativeRow(repo, revision, variant or ALL, reason[:1024], now, now + ttl_s)
        with self._lock, self.index.tx() as conn:
            self.index.put_negative(conn, row)

    def get_negative(self, repo: str, revision: str, variant: str = ALL) -> NegativeRow | None:
        row = self.index.get_negative(repo, revision, variant or ALL)
        if row is None or row.expires_at <= time.time():
            return None
        return row

    # ---- pins and denies ----

    def pin(self, repo: str, revision: str = ALL, variant: str = ALL) -> None:
        """Make trees of ``repo`` (``revision`` ref/commit or all, ``variant`` or all) GC roots."""
        self._writable()
        validate_repo(repo)
        if revision != ALL:
            validate_ref(revision, repo=repo)
        if variant != ALL:
            validate_variant(variant, repo=repo)
        with self._lock, self.index.tx() as conn:
            self.index.put_pin(conn, repo, revision, variant)
        log.info("pinned %s@%s/%s", repo, revision, variant)

    def unpin(self, repo: str, revision: str = ALL, variant: str = ALL) -> bool:
        self._writable()
        with self._lock, self.index.tx() as conn:
            removed = self.index.delete_pin(conn, repo, revision, variant)
        log.info("unpinned %s@%s/%s (%s)", repo, revision, variant, removed)
        return removed

    def pins(self) -> list[PinRow]:
        return self.index.pins()

    def deny(self, repo: str, revision: str = ALL, reason: str = "") -> None:
        """Refuse ``repo`` (or one ref/commit of it) from now on; published to clients."""
        self._writable()
        validate_repo(repo)
        if revision != ALL:
            validate_ref(revision, repo=repo)
        with self._lock:
            with self.index.tx() as conn:
                self.index.put_deny(conn, repo, revision, reason)
            self._publish_index([repo], denies=True)
        log.info("denied %s@%s: %s", repo, revision, reason)

    def allow(self, repo: str, revision: str = ALL) -> bool:
        self._writable()
        with self._lock:
            with self.index.tx() as conn:
                removed = self.index.delete_deny(conn, repo, revision)
            self._publish_index([repo], denies=True)
        log.info("allowed %s@%s (%s)", repo, revision, removed)
        return removed

    def denies(self, repo: str | None = None) -> list[DenyRow]:
        return self.index.denies(repo)

    def check_denied(self, repo: str, revision: str, commit: str | None = None) -> None:
        """Raise :class:`DeniedError` if ``repo`` (or this revision/commit of it) is denied.

        Resolution calls this before any upstream I/O, so a denied kernel is never fetched.
        """
        self._check_denied(repo, revision, commit, {"repo": repo, "commit": commit})

    def _check_denied(
        self, repo: str, revision: str, commit: str | None, ctx: dict[str, str | None]
    ) -> None:
        for d in self.index.denies(repo):
            if d.revision in (ALL, revision, commit):
                raise DeniedError(d.reason, **{k: v for k, v in ctx.items() if v is not None})

    # ---- leases ----

    def acquire_lease(self, tree: str, ttl_s: float, *, holder: str = "") -> Lease:
        """Keep a live tree from GC for ``ttl_s`` seconds."""
        self._writable()
        hexd = _hex(tree)
        with self._lock:
            row = self.index.get_tree(hexd)
            if row is None or row.state != "live":
                raise TreeNotFoundError(f"no live tree sha256:{hexd} to lease")
            now = time.time()
            lease = Lease(uuid.uuid4().hex, f"sha256:{hexd}", now + ttl_s, holder)
            with self.index.tx() as conn:
                self.index.put_lease(conn, LeaseRow(lease.id, hexd, holder, now, lease.expires_at))
        return lease

    def record_leases(
        self,
        leases: Sequence[Lease],
        *,
        resolved: Iterable[tuple[str, float]] = (),
        per_holder: int = 0,
        total: int = 0,
    ) -> int:
        """Record leases granted ahead of the write, in one transaction (one fsync for a
        batch: the daemon answers Resolve at once and writes its leases behind), together with
        the resolve times (LRU) of trees served from its memory, ``(tree digest, unix time)``.
        Leases on trees that are no longer live (or already expired) are skipped; returns how
        many were recorded. The rows go in with ``executemany`` so a large batch costs little
        Python time (request threads wait for the GIL meanwhile). ``per_holder``/``total``
        bound the table in the same transaction (``Index.trim_leases``)."""
        self._writable()
        now = time.time()
        touches = [(_hex(tree), at) for tree, at in resolved]
        rows = [
            (lease.id, lease.holder, now, lease.expires_at, _hex(lease.tree))
            for lease in leases
            if lease.expires_at > now
        ]
        if not rows and not touches:
            return 0
        with self._lock, self.index.tx() as conn:
            if touches:
                self.index.touch_trees(conn, touches)
            recorded = self.index.put_leases_on_live_trees(conn, rows)
            if rows and (per_holder or total):
                holders = {lease.holder for lease in leases}
                self.index.trim_leases(conn, holders, now, per_holder=per_holder, total=total)
            return recorded

    def renew_lease(self, lease_id: str, ttl_s: float) -> Lease:
        self._writable()
        with self._lock:
            row = self.index.get_lease(lease_id)
            now = time.time()
            if row is None or row.expires_at <= now:
                raise LeaseNotFoundError(f"lease {lease_id} is unknown or expired; resolve again")
            with self.index.tx() as conn:
                self.index.extend_lease(conn, lease_id, now + ttl_s)
            return Lease(row.id, f"sha256:{row.tree}", now + ttl_s, row.holder)

    def release_lease(self, lease_id: str) -> bool:
        self._writable()
        with self._lock, self.index.tx() as conn:
            return self.index.delete_lease(conn, lease_id)

    def leases(self) -> list[LeaseRow]:
        return self.index.leases()

    # ---- garbage collection ----

    def gc(self, *, dry_run: bool = False) -> gc_mod.GcReport:
        """Collect garbage and, under pressure, evict least-recently-resolved trees.

        ``dry_run`` reports what would be freed and why each tree is kept, changing nothing.
        """
        if not dry_run:
            self._writable()
        return self._gc(dry_run=dry_run, extra_bytes=0)

    def _gc(self, *, dry_run: bool, extra_bytes: int) -> gc_mod.GcReport:
        now = time.time()
        with self._lock:
            expired = 0
            if not dry_run:
                with self.index.tx() as conn:
                    expired = self.index.delete_expired_leases(conn, now)
            trees = self.index.trees("live", manifests=False)
            blobs = self.index.blobs("live")
            tree_files: dict[str, list[str]] = {}
            for tree_hex, blob in self.index.all_tree_files():
                tree_files.setdefault(tree_hex, []).append(blob)
            variants = self.index.all_variants()
            leased = {lease.tree for lease in self.index.leases() if lease.expires_at > now}
            held = self._held_trees(variants)
            usage = self.index.usage() + self._reserved + extra_bytes
            free = self._free_bytes() - self._reserved - extra_bytes
            plan = gc_mod.plan(
                layout=self.layout,
                policy=self.policy,
                now=now,
                trees=trees,
                blobs=blobs,
                tree_files=tree_files,
                variants=variants,
                pins=self.index.pins(),
                refs=self.index.all_refs(),
                leased=leased,
                held=held,
                usage=usage,
                free=free,
                all_or_nothing=extra_bytes > 0,
            )
            plan.report.leases_expired = expired
            plan.report.dry_run = dry_run
            if dry_run:
                plan.release()
                return plan.report
            victims = plan.report.deleted_trees
            repos: set[str] = set()
            with self.index.tx() as conn:
                for t in victims:
                    self.index.set_tree_state(conn, t.digest, "dead")
                    for v in self.index.delete_variants_of_tree(conn, t.digest):
                        repos.add(v.repo)
                for sha in plan.report.blobs_deleted:
                    self.index.set_blob_state(conn, sha, "dead")
            faults.point("gc.marked")
            self._publish_index(repos)
        for t in victims:
            log.info(
                "gc: deleting tree sha256:%s (%s, %d bytes) %s",
                t.digest,
                t.reason,
                t.bytes_freed,
                " ".join(f"{r}@{c}/{v}" for r, c, v in t.variants),
            )
        self._purge_dead(plan.probes)
        plan.release()
        log.info(
            "gc: freed %d bytes (%d trees, %d blobs); usage %d -> %d",
            plan.report.bytes_freed,
            len(victims),
            len(plan.report.blobs_deleted),
            plan.report.usage_before,
            plan.report.usage_after,
        )
        return plan.report

    def guard_from_gc(self, trees: Callable[[], Iterable[str]]) -> None:
        """Let GC ask ``trees()`` (digests, ``sha256:`` or bare hex) for trees to keep: leases
        the daemon granted but has not written yet. It is called under the store lock, so it
        must not call back into the store."""
        self._gc_guards.append(trees)

    def _held_trees(self, variants: Sequence[Any]) -> set[str]:
        """Trees that open holds name, and trees the guards vouch for (bare hex)."""
        names = self.holds.held()
        held = {v.tree for v in variants if (v.repo, v.commit, v.variant) in names}
        for guard in self._gc_guards:
            held.update(_hex(t) for t in guard())
        return held

    def _purge_dead(self, probes: dict[str, Probe]) -> None:
        """Delete the files of dead rows, then the rows (short lock holds, batched)."""
        while True:
            with self._lock:
                # One batch of digests per round (loading every dead row, manifests and all,
                # each round made purging 1,000 trees in a 100,000-tree store take 1.8 s).
                rows = self.index.tree_digests("dead", limit=64)
                if not rows:
                    break
                for hexd in rows:
                    self._move_to_trash(self.layout.tree_path(hexd))
                    faults.point("gc.tree_moved")
                    self.layout.lock_path(hexd).unlink(missing_ok=True)
                    probe = probes.pop(hexd, None)
                    if probe is not None:
                        probe.release()
                with self.index.tx() as conn:
                    for hexd in rows:
                        self.index.delete_tree(conn, hexd)
            self._empty_trash()
        while True:
            with self._lock:
                dead = self.index.blob_digests("dead", limit=512)
                if not dead:
                    break
                buckets = set()
                for sha in dead:
                    path = self.layout.blob_path(sha)
                    path.unlink(missing_ok=True)
                    buckets.add(path.parent)
                    faults.point("gc.blob_unlinked")
                for bucket in buckets:
                    if bucket.is_dir():
                        fsync_dir(bucket)
                with self.index.tx() as conn:
                    for sha in dead:
                        self.index.delete_blob(conn, sha)

    def _move_to_trash(self, path: Path) -> None:
        if not os.path.lexists(path):
            return
        unseal_top(path)  # renaming a directory needs write permission on it (trees.py)
        os.rename(path, self.layout.trash / os.urandom(8).hex())
        fsync_dir(path.parent)

    def _empty_trash(self) -> None:
        for child in list(self.layout.trash.iterdir()):
            remove_tree(child)

    # ---- verification and quarantine ----

    def verify(
        self,
        *,
        repair: bool = False,
        on_invalidated: Callable[[str, str, str], None] | None = None,
    ) -> verify_mod.VerifyReport:
        """Re-hash every blob and tree; with ``repair`` take whatever is broken out of service.

        Nothing is deleted: a damaged tree or blob may be the only copy (an air-gapped host, an
        upstream that no longer has it), so it is moved into ``v1/quarantine/`` with a note of
        what it was (see `quarantine`). Its variants lose their rows, so the daemon fetches them
        again where an upstream has them; ``on_invalidated(repo, commit, variant)`` is called
        for each. Quarantined entries whose variants are served again are dropped.
        """
        if repair:
            self._writable()
        report = verify_mod.verify(self.layout, self.index, self.owner_uid)
        if repair:
            self._repair(report, on_invalidated)
            self.prune_quarantine()
        return report

    def _repair(
        self,
        report: verify_mod.VerifyReport,
        on_invalidated: Callable[[str, str, str], None] | None,
    ) -> None:
        bad_blobs = {p.id for p in report.problems if p.object == "blob" and p.kind != "unknown"}
        bad_trees = {p.id for p in report.problems if p.object == "tree" and p.kind != "unknown"}
        unknown = [Path(p.path) for p in report.problems if p.kind == "unknown"]
        with self._lock:
            invalidated, kept, _dead = self._take_out(
                bad_blobs, bad_trees, report.problems, "repair"
            )
            for path in unknown:
                if path.parent == self.layout.blobs and path.is_dir():
                    continue  # a stray bucket: its files are reported (and moved) one by one
                entry = self._quarantine_path(path, "unknown", path.name, {"why": "not in index"})
                if entry is not None:
                    kept.append(entry)
        self._purge_dead({})
        report.quarantined = kept
        report.repaired.extend(q.describe() for q in kept)
        report.invalidated = invalidated
        for repo, commit, variant in invalidated:
            log.warning(
                "repair: invalidated %s", _fmt({"repo": repo, "commit": commit, "variant": variant})
            )
            if on_invalidated is not None:
                on_invalidated(repo, commit, variant)

    def _take_out(
        self,
        bad_blobs: Iterable[str],
        bad_trees: Iterable[str],
        problems: Sequence[verify_mod.Problem],
        by: str,
    ) -> tuple[list[tuple[str, str, str]], list[verify_mod.Quarantined], set[str]]:
        """Mark blobs and trees dead (and every tree using a dead blob), drop their variant
        rows, republish the client index, then move their files into the quarantine before
        anything can purge them; caller holds the lock."""
        why: dict[str, list[dict[str, str]]] = {}
        for p in problems:
            why.setdefault(p.id, []).append({"kind": p.kind, "path": p.path, "detail": p.detail})
        trees = set(bad_trees)
        blobs = set(bad_blobs)
        invalidated: list[tuple[str, str, str]] = []
        used_by: dict[str, list[dict[str, Any]]] = {}
        sizes: dict[str, int] = {}
        with self.index.tx() as conn:
            for sha in blobs:
                for tree in self.index.trees_of_blob(sha):
                    if tree not in trees:
                        trees.add(tree)
                        why.setdefault(tree, []).append(
                            {"kind": "uses-damaged-blob", "path": "", "detail": f"blob {sha}"}
                        )
                brow = self.index.get_blob(sha)
                sizes[sha] = brow.size if brow is not None else 0
                self.index.set_blob_state(conn, sha, "dead")
            for hexd in trees:
                for v in self.index.variants_of_tree(hexd):
                    ids = self.index.upstream_ids(v.repo, v.commit, v.variant)
                    used_by.setdefault(hexd, []).append(
                        {"repo": v.repo, "commit": v.commit, "variant": v.variant, "ids": ids}
                    )
                self.index.set_tree_state(conn, hexd, "dead")
                for v in self.index.delete_variants_of_tree(conn, hexd):
                    invalidated.append((v.repo, v.commit, v.variant))
        self._publish_index({r for r, _c, _v in invalidated})
        kept: list[verify_mod.Quarantined] = []
        for hexd in sorted(trees):
            row = self.index.get_tree(hexd)
            note: dict[str, Any] = {
                "why": why.get(hexd, []),
                "variants": used_by.get(hexd, []),
                "manifest": row.manifest.decode() if row is not None else "",
                "by": by,
            }
            entry = self._quarantine_path(self.layout.tree_path(hexd), "tree", hexd, note)
            if entry is not None:
                kept.append(entry)
        for sha in sorted(blobs):
            note = {"why": why.get(sha, []), "size": sizes.get(sha, 0), "by": by}
            entry = self._quarantine_path(self.layout.blob_path(sha), "blob", sha, note)
            if entry is not None:
                kept.append(entry)
        return invalidated, kept, trees

    def _quarantine_path(
        self, path: Path, obj: str, ident: str, note: dict[str, Any]
    ) -> verify_mod.Quarantined | None:
        """Move ``path`` into a new quarantine entry with ``note`` beside it (entry.json).

        None when there is nothing on disk. A path this process may not move (a directory owned
        by another user cannot be renamed to another parent) stays where it is, out of service,
        and the entry says so.
        """
        if not os.path.lexists(path):
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{stamp}-{obj}-{ident[:16]}-{os.urandom(3).hex()}"
        qdir = self.layout.quarantine / name
        self.layout.quarantine.mkdir(mode=DIR_MODE_PRIVATE, exist_ok=True)
        qdir.mkdir(mode=DIR_MODE_PRIVATE)
        moved_to = qdir / obj
        moved = True
        try:
            if not path.is_symlink() and path.is_dir():
                unseal_top(path)  # renaming a directory to another parent rewrites its ".."
            os.rename(path, moved_to)
            fsync_dir(path.parent)
        except OSError as exc:
            moved = False
            note["not_moved"] = f"{exc.strerror}: left at {path}; remove it as root"
            log.error("quarantine: could not move %s: %s; it stays, out of service", path, exc)
        doc = {
            "object": obj,
            "id": ident,
            "original_path": str(path),
            "quarantined_at": time.time(),
            "moved": moved,
            # Recorded once, so that listings and the bound need not walk the entries.
            "bytes": verify_mod.entry_bytes(moved_to) if moved else 0,
            **note,
        }
        tmp = qdir / "entry.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, qdir / "entry.json")
        fsync_dir(qdir)
        fsync_dir(self.layout.quarantine)
        entry = verify_mod.Quarantined.from_doc(qdir, doc)
        log.warning("quarantine: %s", entry.describe())
        self._bound_quarantine(keep=entry.name)
        return entry

    def quarantine(self) -> list[verify_mod.Quarantined]:
        """Every quarantine entry, oldest first."""
        out = []
        base = self.layout.quarantine
        for qdir in sorted(base.iterdir()) if base.is_dir() else []:
            try:
                doc = json.loads((qdir / "entry.json").read_text())
            except (OSError, ValueError):
                continue  # half-written (a crash between mkdir and entry.json): nothing moved
            out.append(verify_mod.Quarantined.from_doc(qdir, doc))
        return out

    def _replaced(self, q: verify_mod.Quarantined) -> bool:
        """True when the store serves again whatever the entry held (re-fetched from upstream)."""
        if q.object == "blob":
            brow = self.index.get_blob(q.id)
            return brow is not None and brow.state == "live"
        if q.object != "tree" or not q.variants:
            return False
        for repo, commit, variant in q.variants:
            vrow = self.index.get_variant(repo, commit, variant)
            tree = self.index.get_tree(vrow.tree) if vrow is not None else None
            if tree is None or tree.state != "live":
                return False
        return True

    def prune_quarantine(self) -> list[verify_mod.Quarantined]:
        """Drop entries that are served again (replaced by a re-fetch); the dropped ones."""
        self._writable()
        dropped = []
        for q in self.quarantine():
            if q.moved and self._replaced(q):
                remove_tree(q.path)
                dropped.append(q)
                log.info("quarantine: dropped %s: it is served again", q.name)
        return dropped

    def drop_quarantined(self, name: str) -> verify_mod.Quarantined:
        """Delete one quarantine entry for good (an admin decided it is not needed)."""
        self._writable()
        q = self._quarantine_entry(name)
        remove_tree(q.path)
        log.warning("quarantine: %s dropped by an admin", q.name)
        return q

    def _quarantine_entry(self, name: str) -> verify_mod.Quarantined:
        for q in self.quarantine():
            if q.name == name or q.path == Path(name):
                return q
        raise InvalidInputError(
            f"no quarantine entry {name!r} in {self.layout.quarantine}; `kerneldctl verify` "
            "lists them",
            path=str(self.layout.quarantine),
        )

    def restore_quarantined(self, name: str) -> list[TreeInfo]:
        """Put a quarantined tree (or blob) back into service, checked like a mirror import:
        every file is re-hashed against its manifest while it is copied into fresh blobs, so
        only intact bytes come back. Fix what made it untrusted (owner, mode) first if it was
        not moved. The entry is removed once everything is published again."""
        self._writable()
        q = self._quarantine_entry(name)
        if not q.moved:
            raise InvalidInputError(
                f"{q.name} was left at {q.original}; nothing to restore from the quarantine",
                path=str(q.path),
            )
        doc = json.loads((q.path / "entry.json").read_text())
        published: list[TreeInfo] = []
        if q.object == "blob":
            self.ingest_file(q.path / "blob", sha256=q.id, size=int(doc.get("size") or 0) or None)
        elif q.object == "tree":
            files = []
            for e in parse_manifest(doc["manifest"].encode()):
                self.ingest_file(q.path / "tree" / e.path, sha256=e.sha256, size=e.size)
                files.append((e, 0o100755 if e.mode & 0o111 else 0o100644))
            for v in doc.get("variants", []):
                ids: dict[str, str] = v.get("ids") or {}
                published.append(
                    self.publish_tree(
                        v["repo"],
                        v["commit"],
                        v["variant"],
                        [
                            TreeFile(e.path, e.sha256, e.size, mode, ids.get(e.path))
                            for e, mode in files
                        ],
                    )
                )
        else:
            raise InvalidInputError(
                f"{q.name} is a file the index never knew ({q.original}); it is not store "
                f"content and cannot be restored: inspect it, then drop it",
                path=str(q.path),
            )
        remove_tree(q.path)
        log.warning("quarantine: %s restored (%d variant(s))", q.name, len(published))
        return published

    def quarantine_count(self) -> int:
        """Entries in the quarantine, without reading them (the status line, every few s)."""
        try:
            return len(os.listdir(self.layout.quarantine))
        except OSError:
            return 0

    def quarantine_usage(self) -> tuple[int, int]:
        """(entries, bytes they hold) of the quarantine: what status and metrics show."""
        entries = self.quarantine()
        return len(entries), sum(q.size_bytes for q in entries)

    def _bound_quarantine(self, keep: str) -> list[verify_mod.Quarantined]:
        """Drop entries until the quarantine is within `quarantine_max_bytes`, never ``keep``
        (the entry just added: the newest damage is the one an admin still has to look at).

        Entries served again go first (nothing is lost with them), then the oldest; entries
        that hold no bytes (left in place) are kept, dropping them frees nothing. One log line
        per entry dropped, saying what it was and why it went.
        """
        bound = self.quarantine_max_bytes
        if bound <= 0:
            return []
        entries = self.quarantine()
        total = sum(q.size_bytes for q in entries)
        if total <= bound:
            return []
        others = [q for q in entries if q.name != keep and q.size_bytes > 0]
        replaced = {q.name for q in others if q.moved and self._replaced(q)}
        order = sorted(others, key=lambda q: (q.name not in replaced, q.quarantined_at, q.name))
        dropped = []
        for q in order:
            if total <= bound:
                break
            remove_tree(q.path)
            total -= q.size_bytes
            dropped.append(q)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(q.quarantined_at))
            log.warning(
                "quarantine: dropped %s (%s, %d bytes, quarantined %s UTC by %s%s): the "
                "quarantine was over [store] quarantine_max = %d bytes with the new entry %s; "
                "%s",
                q.name,
                q.what,
                q.size_bytes,
                when,
                q.by or "?",
                f", {q.reason}" if q.reason else "",
                bound,
                keep,
                "it is served again" if q.name in replaced else "the oldest entries go first",
            )
        if total > bound:
            log.warning(
                "quarantine: %d bytes after dropping %d older entr(ies), over [store] "
                "quarantine_max = %d bytes: the new entry %s alone is larger; it is kept",
                total,
                len(dropped),
                bound,
                keep,
            )
        return dropped

    def annotate_quarantined(self, name: str, extra: dict[str, Any]) -> verify_mod.Quarantined:
        """Add ``extra`` to an entry's entry.json (who reported the damage, and why): the
        forensics an admin reads before restoring or dropping it."""
        self._writable()
        q = self._quarantine_entry(name)
        path = q.path / "entry.json"
        doc = {**json.loads(path.read_text()), **extra}
        tmp = q.path / "entry.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        fsync_dir(q.path)
        return verify_mod.Quarantined.from_doc(q.path, doc)

    def invalidate(
        self,
        *,
        trees: Iterable[str] = (),
        blobs: Iterable[str] = (),
        problems: Sequence[verify_mod.Problem] = (),
    ) -> tuple[list[tuple[str, str, str]], set[str], list[verify_mod.Quarantined]]:
        """Take damaged trees and blobs out of service at once (the scrub's repair).

        Only rows that are still live are touched, so a tree GC removed (or replaced) while it
        was being checked is left alone. Everything marked dead is quarantined, not deleted
        (see `verify`); clients see the variants disappear from the index (a miss: they ask the
        daemon, which fetches again). Returns the invalidated (repo, commit, variant), the dead
        tree digests and the quarantine entries.
        """
        self._writable()
        with self._lock:
            live_trees = []
            for digest in trees:
                hexd = _hex(digest)
                row = self.index.get_tree(hexd)
                if row is not None and row.state == "live":
                    live_trees.append(hexd)
            live_blobs = []
            for sha in blobs:
                brow = self.index.get_blob(sha)
                if brow is not None and brow.state == "live":
                    live_blobs.append(sha)
            if not live_trees and not live_blobs:
                return [], set(), []
            invalidated, kept, dead = self._take_out(live_blobs, live_trees, problems, "scrub")
        self._purge_dead({})
        for repo, commit, variant in invalidated:
            log.warning(
                "invalidated damaged tree %s",
                _fmt({"repo": repo, "commit": commit, "variant": variant}),
            )
        return invalidated, dead, kept

    def live_tree_digests(self) -> list[str]:
        """Hex digests of every live tree, sorted (the scrub walks them in this order)."""
        return self.index.tree_digests("live")

    def mark_as_cache(self) -> None:
        """Write `CACHEDIR.TAG` into the root (once): a user-mode store under ~/.cache is a
        cache that backups should skip, everything in it can be fetched again."""
        tag = self.layout.cachedir_tag
        if tag.exists() or self.read_only:
            return
        text = (
            "Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This file is a cache directory tag created by kerneld (its kernel store).\n"
            "# For information about cache directory tags see https://bford.info/cachedir/\n"
        )
        tmp = tag.with_name(f".{tag.name}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, tag)

    def get_meta(self, key: str) -> str | None:
        return self.index.get_meta(key)

    def set_meta(self, key: str, value: str | None) -> None:
        """Set (or with None delete) a small store-level fact, e.g. when the scrub last ran."""
        self._writable()
        with self._lock, self.index.tx() as conn:
            if value is None:
                self.index.delete_meta(conn, key)
            else:
                self.index.set_meta(conn, key, value)

    # ---- client index ----

    def _publish_index(
        self, repos: Iterable[str], *, denies: bool = False, skip_unchanged: bool = False
    ) -> None:
        """Rewrite the client index files of ``repos`` (caller holds the lock or is alone).

        ``skip_unchanged`` (the check at every open) leaves files that already say the same
        alone: rewriting each with two fsyncs made a restart with 100,000 trees take a minute.
        """
        repos = sorted(set(repos))
        if not repos and not denies:
            return
        with self._lock:
            with self.index.tx() as conn:
                generation = self.index.next_generation(conn)
            self.generation = generation
            for repo in repos:
                path = self.layout.repo_index_path(repo)
                doc = client_index.build_repo_doc(
                    self.index, self.layout, repo, generation, require_signed=self._require_signed
                )
                if not doc["refs"] and not doc["commits"] and not doc["denies"]:
                    client_index.remove(path)
                elif not (skip_unchanged and client_index.unchanged(path, doc)):
                    client_index.atomic_write_json(path, doc)
            if denies:
                path = self.layout.client_index / "denies.json"
                doc = client_index.build_denies_doc(self.index, generation)
                if not (skip_unchanged and client_index.unchanged(path, doc)):
                    client_index.atomic_write_json(path, doc)
        faults.point("index.published")

    def publish_document(self, name: str, doc: dict[str, Any]) -> None:
        """Write a store-wide document next to the client index (`index/v1/<name>`), for
        readers of the warm path; unchanged content is not rewritten."""
        if "/" in name or name.startswith(".") or not name.endswith(".json"):
            raise ValueError(f"not a document name: {name!r}")
        path = self.layout.client_index / name
        with self._lock:
            if not client_index.unchanged(path, doc):
                client_index.atomic_write_json(path, doc)

    def read_document(self, name: str) -> dict[str, Any] | None:
        """A document `publish_document` wrote (None if missing or unreadable)."""
        try:
            doc = json.loads((self.layout.client_index / name).read_bytes())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None


def _root_owner(root: Path) -> int:
    try:
        return os.stat(root).st_uid
    except OSError:
        return os.geteuid()


def _record_owner(index: Index, uid: int) -> None:
    """Keep the index's note of the owner in step with the root directory (informational: the
    root decides). A changed owner means an admin ran ``chown -R``: say so once."""
    recorded = index.get_meta("owner_uid")
    if recorded == str(uid):
        return
    with index.tx() as conn:
        index.set_meta(conn, "owner_uid", str(uid))
        if index.get_meta("created_at") is None:
            index.set_meta(conn, "created_at", str(time.time()))
    if recorded is not None:
        log.warning(
            "the store now belongs to %s (uid %d, the owner of its root directory), not uid %s: "
            "files still owned by the old owner show up as untrusted in `kerneldctl verify`",
            user_name(uid),
            uid,
            recorded,
        )


@contextlib.contextmanager
def _step(operation: str, path: Path, root: Path) -> Iterator[None]:
    """Turn a refused file operation while opening into an error that names the step, the path
    and the fix (the daemon logs it as its reason not to start)."""
    try:
        yield
    except (PermissionError, OSError) as exc:
        if isinstance(exc, StoreError) or exc.errno not in (errno.EPERM, errno.EACCES):
            raise
        where = exc.filename or path
        me = user_name(os.geteuid())
        if not root.exists():
            parent = next((p for p in root.parents if p.exists()), Path("/"))
            raise StoreOwnershipError(
                f"cannot {operation}: {exc.strerror} on {where} (running as {me}; {parent} "
                f"belongs to {user_name(_root_owner(parent))}); create it for {me} as root: "
                f"`install -d -o {me} -g {me} {root}`, or give kerneld a store path it may create",
                path=str(where),
            ) from None
        raise StoreOwnershipError(
            f"cannot {operation}: {exc.strerror} on {where} (running as {me}, the store root "
            f"{root} belongs to {user_name(_root_owner(root))}); every file of a store must "
            f"belong to the user that runs kerneld: as root, run `chown -R {me}: {root}`, or run "
            "kerneld as the store's owner",
            path=str(where),
        ) from None


def _chunks(source: bytes | Iterable[bytes] | BinaryIO) -> Iterator[bytes | memoryview]:
    if isinstance(source, bytes):
        view = memoryview(source)  # slices of immutable bytes: no copies
        for i in range(0, len(view), 8 << 20):
            yield view[i : i + (8 << 20)]
        return
    read = getattr(source, "read", None)
    if read is not None:
        while chunk := read(READ_CHUNK):
            yield chunk
        return
    yield from source


def _fmt(ctx: dict[str, str | None]) -> str:
    return " ".join(f"{k}={v}" for k, v in ctx.items() if v is not None)
