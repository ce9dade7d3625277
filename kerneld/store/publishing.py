"""Publishing a variant tree from ingested blobs: validate the files, check ``metadata.json``
(and, with a check installed, who signed it), build the tree in a staging directory outside the
lock, rename it into ``trees/``, make it valid with its index row, and rewrite the published index
of the repo last. An identical tree already in the store is shared (dedupe across revisions
and repos).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import faults
from .errors import (
    BlobMissingError,
    InvalidInputError,
    MetadataError,
    SizeMismatchError,
    log_context,
)
from .ingest import READ_CHUNK
from .layout import fsync_dir
from .locks import create_tree_lock
from .manifest import (
    METADATA_FILE,
    ManifestEntry,
    TreeFile,
    VariantMetadata,
    canonical_manifest,
    check_metadata_digest,
    parse_metadata,
    sort_entries,
    tree_digest,
)
from .names import Names
from .paths import (
    check_unique_paths,
    normalize_mode,
    validate_commit,
    validate_hex,
    validate_relpath,
    validate_repo,
    validate_variant,
)
from .published_index_writer import PublishedIndexWriter
from .signatures import Signatures
from .space import Space
from .state import StoreState
from .trees import build_staging, remove_tree, seal_top
from .types import ProvenanceRecord

log = logging.getLogger("kerneld.store")


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


class Publisher:
    """Turns ingested blobs into published variant trees."""

    def __init__(
        self,
        state: StoreState,
        *,
        space: Space,
        names: Names,
        signatures: Signatures,
        writer: PublishedIndexWriter,
        move_to_trash: Callable[[Path], None],
        require_metadata_digest: bool,
        use_hardlinks: bool,
    ) -> None:
        self._state = state
        self._space = space
        self._names = names
        self._signatures = signatures
        self._writer = writer
        self._move_to_trash = move_to_trash
        self.require_metadata_digest = require_metadata_digest
        self.use_hardlinks = use_hardlinks

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
        valid by the index row; the published index of ``repo`` is rewritten last.
        """
        state, index = self._state, self._state.index
        state.writable()
        validate_repo(repo)
        ctx: dict[str, str | None] = {"repo_id": repo}
        validate_commit(commit, **ctx)
        ctx["commit"] = commit
        validate_variant(variant, **ctx)
        ctx["variant"] = variant
        self._names.check_denied(repo, commit, commit, ctx)

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
        with state.lock:
            missing = []
            for path, mode, sha, size, _oid in wanted:
                row = index.get_blob(sha)
                if row is None or row.state != "live":
                    missing.append(sha)
                    continue
                if size is not None and size != row.size:
                    raise SizeMismatchError(size, row.size, "file size", path=path, **ctx)
                index.claim_blob(sha, time.time())  # GC keeps it until we are done
                entries.append(ManifestEntry(path, mode, row.size, sha))
        if missing:
            raise BlobMissingError(missing, **ctx)
        entries = sort_entries(entries)
        by_path = {e.path: e for e in entries}
        digest = tree_digest(entries)
        hexd = digest.removeprefix("sha256:")
        upstream_ids = [(w[0], w[4]) for w in wanted if w[4]]

        meta, checked = self.check_metadata(by_path, ctx)
        provenance = self._signatures.check_new(hexd, by_path, checked, ctx)
        job = _Publish(
            repo, commit, variant, hexd, entries, upstream_ids, meta, checked, provenance
        )

        with state.lock:
            existing = index.get_tree(hexd)
            if existing is not None and existing.state == "live":
                return self._add_variant(job, created=False)

        reserved = 0

        def reserve(n: int) -> None:
            nonlocal reserved
            self._space.reserve(n, ctx)
            reserved += n

        try:
            staging, copied = build_staging(
                state.layout, entries, reserve=reserve, use_hardlinks=self.use_hardlinks, ctx=ctx
            )
            try:
                faults.point("tree.staged")
                with state.lock:
                    state.writable()
                    existing = index.get_tree(hexd)
                    if existing is not None and existing.state == "live":
                        remove_tree(staging)
                        return self._add_variant(job, created=False)
                    self._commit_tree(job, copied, staging, ctx)
                    return self._add_variant(job, created=True)
            finally:
                if staging.exists():
                    remove_tree(staging)
        finally:
            self._space.unreserve(reserved)

    def check_files_metadata(
        self, repo: str, commit: str, variant: str, files: Iterable[TreeFile]
    ) -> VariantMetadata:
        """The metadata.json checks `publish_tree` makes (present, parsable, its digest
        matching the files), on blobs already ingested, before anything is published: a mirror
        import refuses a kernel whole rather than publish some of its variants."""
        by_path = {f.path: ManifestEntry(f.path, 0o444, f.size or 0, f.sha256) for f in files}
        meta, _ = self.check_metadata(
            by_path, {"repo_id": repo, "commit": commit, "variant": variant}
        )
        return meta

    def check_metadata(
        self, by_path: dict[str, ManifestEntry], ctx: dict[str, str | None]
    ) -> tuple[VariantMetadata, bool]:
        """metadata.json of these files, parsed, and whether its digest was there and matched
        every file (MetadataError/MetadataDigestError: it is missing, too large or wrong)."""
        layout = self._state.layout
        entry = by_path.get(METADATA_FILE)
        if entry is None:
            raise MetadataError(
                "the variant has no metadata.json (it is mandatory in the Kernel Hub format)",
                **ctx,
            )
        if entry.size > (1 << 20):
            raise MetadataError(f"metadata.json is {entry.size} bytes, over 1 MiB", **ctx)
        try:
            raw = layout.blob_path(entry.sha256).read_bytes()
        except FileNotFoundError:
            raise BlobMissingError([entry.sha256], path=METADATA_FILE, **ctx) from None
        if hashlib.sha256(raw).hexdigest() != entry.sha256:
            raise BlobMissingError([entry.sha256], path=METADATA_FILE, **ctx)
        doc, meta = parse_metadata(raw, **ctx)

        def hash_file(algorithm: str, path: str) -> bytes:
            h = hashlib.new(algorithm)
            with open(layout.blob_path(by_path[path].sha256), "rb") as f:
                while chunk := f.read(READ_CHUNK):
                    h.update(chunk)
            return h.digest()

        checked = check_metadata_digest(
            doc, by_path, hash_file, require=self.require_metadata_digest, **ctx
        )
        if not checked:
            log.warning(
                "metadata.json has no digest; files verified by upstream ids only %s",
                log_context(ctx),
            )
        return meta, checked

    def _commit_tree(
        self, job: _Publish, copied: int, staging: Path, ctx: dict[str, str | None]
    ) -> None:
        """Rename a staged tree into place and record it (caller holds the lock)."""
        index, layout = self._state.index, self._state.layout
        hexd, entries, meta = job.hexd, job.entries, job.meta
        missing = [
            e.sha256
            for e in entries
            if (row := index.get_blob(e.sha256)) is None or row.state != "live"
        ]
        if missing:
            raise BlobMissingError(missing, **ctx)
        with index.tx() as conn:
            index.put_tree(
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
        create_tree_lock(layout.lock_path(hexd))
        target = layout.tree_path(hexd)
        if os.path.lexists(target):
            self._move_to_trash(target)
        os.rename(staging, target)
        faults.point("tree.renamed")
        seal_top(target)  # only now: a non-root daemon cannot rename a 0555 directory
        fsync_dir(layout.trees)

    def _add_variant(self, job: _Publish, *, created: bool) -> TreeInfo:
        """Make the tree live and point (repo, commit, variant) at it (caller holds the lock)."""
        index, layout = self._state.index, self._state.layout
        repo, commit, variant, hexd = job.repo, job.commit, job.variant, job.hexd
        entries, upstream_ids = job.entries, job.upstream_ids
        with index.tx() as conn:
            if created:
                index.set_tree_state(conn, hexd, "live")
            if job.provenance is not None:
                index.put_provenance(conn, hexd, job.provenance)
            index.put_variant(
                conn,
                repo=repo,
                commit=commit,
                variant=variant,
                tree=hexd,
                upstream_ids=[(p, oid) for p, oid in upstream_ids if oid],
            )
            index.delete_negative_of(conn, repo)
        faults.point("tree.live")
        self._writer.publish([repo])
        size = sum(e.size for e in entries)
        log.info(
            "published %s tree sha256:%s (%d files, %d bytes, %s) %s",
            variant,
            hexd,
            len(entries),
            size,
            "new" if created else "deduplicated",
            log_context({"repo_id": repo, "commit": commit, "variant": variant}),
        )
        return TreeInfo(
            repo=repo,
            commit=commit,
            variant=variant,
            digest=f"sha256:{hexd}",
            path=layout.tree_path(hexd),
            lock_path=layout.lock_path(hexd),
            size=size,
            files=len(entries),
            created=created,
            metadata=job.meta,
            metadata_digest_checked=job.checked,
            provenance=job.provenance,
        )
