"""Write a (signed) mirror out of a store: `kerneldctl mirror export` and the `MirrorExport` RPC.

Only what the store holds is exported (prefetch first): for every selected kernel the published
variants of the chosen commit, their blobs (re-hashed while copied, so store corruption never
reaches a mirror), a per-commit manifest and the refs that led there. Exports are incremental:
a blob the destination already has is not copied again, manifests and refs are merged with what
is there (variants and refs accumulate), and an unchanged manifest only gains the new signatures
(so a mirror can carry the signatures of an old and a new key during a key rotation).

A destination ending in `.tar` is assembled in a staging directory beside it (starting from the
existing tar's contents, read through the same safety checks as an import) and renamed into
place at the end, so a reader never sees a half-written tar.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kerneld.mirror.bundle import BundleError, open_bundle
from kerneld.mirror.documents import (
    INFO,
    Manifest,
    MirrorFormatError,
    MirrorWriter,
    blob_path,
    info_json,
    manifest_path,
    parse_info,
    parse_refs,
    parse_refs_exported_at,
    refs_json,
    refs_path,
)
from kerneld.mirror.keys import (
    SignatureError,
    SigningKey,
    parse_signature_file,
    sig_path,
    signature_file,
)
from kerneld.mirror.progress import MirrorProgress, ProgressFn, emit
from kerneld.store import BlobProvider, Store
from kerneld.store.layout import FILE_MODE_EXEC
from kerneld.store.manifest import ManifestEntry, parse_manifest
from kerneld.upstream.base import RemoteFile, check_repo_id, is_commit
from kerneld_client.lockfile import LockFile

CHUNK = 1 << 20
_SPEC_RE = re.compile(r"^([^/@:\s]+/[^/@:\s]+)(?::(\d+)|@(\S+))?$")
LEASE_S = 6 * 3600.0


class ExportError(ValueError):
    """The export cannot be done as asked; nothing was written (or the write failed)."""


@dataclass(frozen=True)
class ExportSpec:
    """A kernel to export.

    `commit` set: that commit (and `ref`, if given, is recorded as pointing at it). Only `ref`
    set: the commit the store's `ref` points at. Neither: every commit of the repo in the store,
    with every store ref that points at one of them.
    """

    repo_id: str
    ref: str | None = None
    commit: str | None = None

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)
        if self.commit is not None and not is_commit(self.commit):
            raise ValueError(f"{self.repo_id}: commit must be 40 lowercase hex: {self.commit!r}")

    @classmethod
    def parse(cls, text: str) -> ExportSpec:
        """`org/name`, `org/name:1` (version 1, branch v1), `org/name@rev` (ref or commit)."""
        m = _SPEC_RE.match(text.strip())
        if not m:
            raise ValueError(
                f"expected 'org/name', 'org/name:VERSION' or 'org/name@REVISION', got {text!r}"
            )
        repo, version, rev = m.group(1), m.group(2), m.group(3)
        if version is not None:
            return cls(repo, ref=f"v{int(version)}")
        if rev is not None and is_commit(rev):
            return cls(repo, commit=rev)
        return cls(repo, ref=rev)

    def __str__(self) -> str:
        return (
            f"{self.repo_id}@{self.commit or self.ref}"
            if self.commit or self.ref
            else (self.repo_id)
        )


def specs_from_lock(lock: LockFile) -> list[ExportSpec]:
    """Export specs for every entry of a lock file (either format) at its locked commit."""
    specs: list[ExportSpec] = []
    for repo_id, commit, ref in lock.pinned():
        if len(commit) != 40:
            raise ExportError(f"{repo_id}: sha256 commit ids are not supported ({commit})")
        specs.append(ExportSpec(repo_id, ref=None if ref == commit else ref, commit=commit))
    return specs


def specs_from_wire(kernels: Iterable[Any], lockfile_json: str = "") -> list[ExportSpec]:
    """The specs of an `Admin.MirrorExport` request.

    A `KernelRef` with no selector means everything the store holds of the repo (as
    `kerneldctl mirror export org/name` does); `version` N the commit of branch vN; `revision` a
    ref or commit; `locked_commit` that commit. `lockfile_json` is a kernels.lock (either format).
    """
    from kerneld_client.lockfile import LockfileError, parse_lockfile

    specs: list[ExportSpec] = []
    for ref in kernels:
        which = ref.WhichOneof("selector")
        if which == "version":
            specs.append(ExportSpec(ref.repo_id, ref=f"v{ref.version}"))
        elif which == "locked_commit":
            specs.append(ExportSpec(ref.repo_id, commit=ref.locked_commit))
        elif which == "revision" and is_commit(ref.revision):
            specs.append(ExportSpec(ref.repo_id, commit=ref.revision))
        elif which == "revision":
            specs.append(ExportSpec(ref.repo_id, ref=ref.revision))
        else:
            specs.append(ExportSpec(ref.repo_id))
    if lockfile_json:
        try:
            specs += specs_from_lock(parse_lockfile(lockfile_json, source="lockfile_json"))
        except LockfileError as exc:
            raise ExportError(str(exc)) from None
    return specs


@dataclass
class _File:
    entry: ManifestEntry
    upstream_id: str | None


@dataclass
class _Kernel:
    repo_id: str
    commit: str
    variants: dict[str, list[_File]] = field(default_factory=dict)
    trees: list[str] = field(default_factory=list)


@dataclass
class ExportReport:
    destination: str
    kernels: list[dict[str, Any]] = field(default_factory=list)
    manifests_written: int = 0
    manifests_unchanged: int = 0
    blobs_written: int = 0
    blobs_present: int = 0
    bytes_written: int = 0
    signed_by: list[str] = field(default_factory=list)
    skipped_variants: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "kernels": self.kernels,
            "manifests_written": self.manifests_written,
            "manifests_unchanged": self.manifests_unchanged,
            "blobs_written": self.blobs_written,
            "blobs_present": self.blobs_present,
            "bytes_written": self.bytes_written,
            "signed_by": self.signed_by,
            "skipped_variants": self.skipped_variants,
        }


# ---- planning -------------------------------------------------------------------------------


def _tree_files(store: Store, repo: str, commit: str, variant: str) -> tuple[str, list[_File]]:
    tree = store.published_tree(repo, commit, variant)
    if tree is None:
        raise ExportError(f"{repo}@{commit} [{variant}]: vanished from the store during export")
    ids = store.upstream_ids(repo, commit, variant)
    files = [_File(e, ids.get(e.path)) for e in parse_manifest(tree.manifest)]
    return tree.digest, files


def _plan(
    store: Store, specs: Sequence[ExportSpec], variants: Sequence[str] | None
) -> tuple[dict[tuple[str, str], _Kernel], dict[str, dict[str, str]], list[str]]:
    wanted = None if not variants or list(variants) == ["all"] else list(dict.fromkeys(variants))
    if wanted is not None and ("auto" in wanted or "all" in wanted):
        raise ExportError(
            "an export takes 'all' or variant names (which variants a host runs is decided on "
            "the importing side)"
        )
    kernels: dict[tuple[str, str], _Kernel] = {}
    refs: dict[str, dict[str, str]] = {}
    skipped: list[str] = []
    problems: list[str] = []
    for spec in specs:
        repo = spec.repo_id
        if spec.commit is None and spec.ref is None:
            commits = sorted({v.commit for v in store.variants_of(repo)})
            if not commits:
                problems.append(f"{repo}: nothing of it is in the store (prefetch it first)")
                continue
            for r in store.refs_of(repo):
                if r.commit in commits:
                    refs.setdefault(repo, {})[r.ref] = r.commit
        else:
            commit = spec.commit or store.resolve_revision(repo, str(spec.ref))
            if commit is None:
                problems.append(
                    f"{spec}: this store does not know that revision (prefetch it first)"
                )
                continue
            commits = [commit]
            if spec.ref is not None and spec.ref != commit:
                refs.setdefault(repo, {})[spec.ref] = commit
        for commit in commits:
            available = store.variants(repo, commit)
            if not available:
                problems.append(
                    f"{repo}@{commit}: no variant of this commit is in the store "
                    "(prefetch it first)"
                )
                continue
            chosen = available if wanted is None else [v for v in wanted if v in available]
            if wanted is not None:
                skipped += [f"{repo}@{commit} [{v}]" for v in wanted if v not in available]
            if not chosen:
                problems.append(
                    f"{repo}@{commit}: none of the variants {', '.join(wanted or [])} is in "
                    f"the store (it has: {', '.join(available)})"
                )
                continue
            kernel = kernels.setdefault((repo, commit), _Kernel(repo, commit))
            for name in chosen:
                if name not in kernel.variants:
                    digest, files = _tree_files(store, repo, commit, name)
                    kernel.variants[name] = files
                    kernel.trees.append(digest)
    if problems:
        raise ExportError("cannot export:\n  " + "\n  ".join(problems))
    return kernels, refs, skipped


# ---- writing --------------------------------------------------------------------------------


def _manifest_for(kernel: _Kernel) -> Manifest:
    variants: dict[str, list[RemoteFile]] = {}
    execs: dict[str, frozenset[str]] = {}
    for name, files in kernel.variants.items():
        entries = []
        for f in files:
            oid = f.upstream_id
            git_sha1 = oid if oid is not None and is_commit(oid) else None
            entries.append(
                RemoteFile(f.entry.path, f.entry.size, sha256=f.entry.sha256, git_sha1=git_sha1)
            )
        variants[name] = entries
        ex = frozenset(f.entry.path for f in files if f.entry.mode == FILE_MODE_EXEC)
        if ex:
            execs[name] = ex
    return Manifest(kernel.repo_id, kernel.commit, variants, execs)


class _Target:
    """Where an export's files go: a directory this process writes (DirTarget), or a stream to
    the caller who writes them (StreamTarget: the daemon never writes a caller-chosen path)."""

    def read(self, rel: str) -> bytes | None:
        """A document already at the destination (written earlier in this export included)."""
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, rel: str) -> None:
        """Remove `rel` if present (a signature of bytes that are gone)."""
        raise NotImplementedError

    def has_blob(self, sha256: str, size: int) -> bool:
        raise NotImplementedError

    def put_blob(self, store: Store, entry: ManifestEntry) -> int:
        """Copy one blob out of the store, re-hashing it; returns its size."""
        raise NotImplementedError


class DirTarget(_Target):
    def __init__(self, root: Path, name: str = "") -> None:
        check_mirror_dir(root)
        self.root = root
        self.writer = MirrorWriter(root, name=name)

    def read(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        self.writer.write_file(rel, data)

    def delete(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    def has_blob(self, sha256: str, size: int) -> bool:
        return self.writer.has_blob(sha256, size)

    def put_blob(self, store: Store, entry: ManifestEntry) -> int:
        return _copy_blob(store, self.root, entry)


@dataclass(frozen=True)
class FileOp:
    """One step of a streamed export: `file` starts `path` (`size` bytes; `data` its first
    bytes), `data` continues it, `delete` removes `path` at the destination."""

    kind: str
    path: str
    size: int = 0
    data: bytes = b""


class StreamTarget(_Target):
    """Sends the export's files to `send` in chunks of at most CHUNK bytes.

    `existing`: the documents the caller's destination holds (so manifests, refs and signatures
    merge as they would on disk); `present`: sha256 of the blobs it already has.
    """

    def __init__(
        self,
        existing: dict[str, bytes],
        present: Iterable[str],
        send: Callable[[FileOp], None],
    ) -> None:
        self.docs = dict(existing)
        self.present = set(present)
        self.send = send

    def read(self, rel: str) -> bytes | None:
        return self.docs.get(rel)

    def write(self, rel: str, data: bytes) -> None:
        self.docs[rel] = data
        self.send(FileOp("file", rel, len(data), data[:CHUNK]))
        for at in range(CHUNK, len(data), CHUNK):
            self.send(FileOp("data", rel, len(data), data[at : at + CHUNK]))

    def delete(self, rel: str) -> None:
        if self.docs.pop(rel, None) is not None:
            self.send(FileOp("delete", rel))

    def has_blob(self, sha256: str, size: int) -> bool:
        return sha256 in self.present

    def put_blob(self, store: Store, entry: ManifestEntry) -> int:
        rel = blob_path(entry.sha256)
        h = hashlib.sha256()
        n = 0
        self.send(FileOp("file", rel, entry.size))
        with _open_store_blob(store, entry) as src:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                n += len(chunk)
                if n > entry.size:
                    break
                self.send(FileOp("data", rel, entry.size, chunk))
        _check_copied(entry, h.hexdigest(), n)
        self.present.add(entry.sha256)
        return n


def check_mirror_dir(root: Path) -> None:
    """ExportError unless `root` is absent, empty, or a kerneld mirror directory."""
    if root.exists() and not root.is_dir():
        raise ExportError(f"{root} exists and is not a directory")
    info = root / INFO
    if info.is_file():
        try:
            parse_info(info.read_bytes())
        except MirrorFormatError as exc:
            raise ExportError(f"{root}: {exc}") from None
    elif root.is_dir() and any(root.iterdir()):
        raise ExportError(
            f"{root} is not empty and is not a kerneld mirror (no {INFO}); choose an empty or "
            "new directory"
        )


def _merge_manifest(target: _Target, new: Manifest) -> Manifest:
    """Union with the manifest already at the destination (new variants win)."""
    old_raw = target.read(manifest_path(new.repo_id, new.commit))
    if old_raw is None:
        return new
    try:
        old = Manifest.from_json(old_raw, repo_id=new.repo_id, commit=new.commit)
    except MirrorFormatError:
        return new  # replaced: a broken manifest is worth nothing
    variants = {**old.variants, **new.variants}
    execs = {k: v for k, v in old.executables.items() if k not in new.variants}
    execs.update(new.executables)
    return Manifest(new.repo_id, new.commit, variants, execs)


def write_signed(target: _Target, rel: str, data: bytes, keys: Sequence[SigningKey]) -> bool:
    """Write `rel` unless identical; keep, extend or drop its signatures. True if rel changed."""
    old = target.read(rel)
    changed = old != data
    if changed:
        target.write(rel, data)
    sig_rel = sig_path(rel)
    if not keys:
        if changed:
            target.delete(sig_rel)  # it signed bytes that are gone
        return changed
    sig = merged_signatures(rel, data, None if changed else target.read(sig_rel), keys)
    if sig is not None:
        target.write(sig_rel, sig)
    return changed


def merged_signatures(
    rel: str, data: bytes, old_sig: bytes | None, keys: Sequence[SigningKey]
) -> bytes | None:
    """The `.sig` file of `data` with each key's signature added to those of `old_sig` (which
    must sign these same bytes); None when it already holds them all."""
    old_sigs: dict[str, bytes] = {}
    if old_sig is not None:
        try:
            old_sigs = parse_signature_file(old_sig, rel=rel)
        except SignatureError:
            old_sigs = {}
    # Ed25519 signatures are deterministic: an equal signature means nothing to add.
    fresh = {k.name: k.sign(rel, data) for k in keys}
    if old_sig is not None and all(old_sigs.get(n) == v for n, v in fresh.items()):
        return None
    return signature_file({**old_sigs, **fresh})


def _open_store_blob(store: BlobProvider, f: ManifestEntry) -> IO[bytes]:
    try:
        return store.open_blob(f.sha256)
    except FileNotFoundError:
        raise ExportError(
            f"blob {f.sha256} ({f.path}) vanished from the store during export"
        ) from None


def _check_copied(f: ManifestEntry, digest: str, size: int) -> None:
    if digest != f.sha256 or size != f.size:
        raise ExportError(
            f"the store's copy of {f.path} (blob {f.sha256}) is corrupt; run "
            "`kerneldctl verify --repair` and prefetch again"
        )


def _copy_blob(store: Store, root: Path, f: ManifestEntry) -> int:
    """Copy one blob out of the store, re-hashing it; returns its size."""
    dest = root / blob_path(f.sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    h = hashlib.sha256()
    n = 0
    try:
        with os.fdopen(fd, "wb") as out:
            with _open_store_blob(store, f) as src_fh:
                while chunk := src_fh.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        _check_copied(f, h.hexdigest(), n)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def _export_files(
    store: Store,
    target: _Target,
    kernels: dict[tuple[str, str], _Kernel],
    refs: dict[str, dict[str, str]],
    keys: Sequence[SigningKey],
    name: str,
    report: ExportReport,
    progress: ProgressFn | None,
) -> None:
    info = target.read(INFO)
    if info is None:
        target.write(INFO, info_json(name))
    else:
        try:
            parse_info(info)
        except MirrorFormatError as exc:
            raise ExportError(f"{report.destination}: {exc}") from None

    # Blobs first: a manifest never names a blob the mirror does not have yet.
    todo: dict[str, ManifestEntry] = {}
    for kernel in kernels.values():
        for files in kernel.variants.values():
            for f in files:
                todo.setdefault(f.entry.sha256, f.entry)
    missing = {s: e for s, e in todo.items() if not target.has_blob(s, e.size)}
    total = sum(e.size for e in missing.values())
    done = 0
    report.blobs_present = len(todo) - len(missing)
    for _sha, entry in sorted(missing.items()):
        done += target.put_blob(store, entry)
        report.blobs_written += 1
        emit(
            progress,
            MirrorProgress(
                "blob",
                detail=entry.path,
                bytes_done=done,
                bytes_total=total,
                blobs=report.blobs_written,
            ),
        )
    report.bytes_written = done

    for (repo, commit), kernel in sorted(kernels.items()):
        manifest = _merge_manifest(target, _manifest_for(kernel))
        rel = manifest_path(repo, commit)
        if write_signed(target, rel, manifest.to_json(), keys):
            report.manifests_written += 1
        else:
            report.manifests_unchanged += 1
        report.kernels.append(
            {
                "repo_id": repo,
                "commit": commit,
                "variants": sorted(kernel.variants),
                "refs": sorted(r for r, c in refs.get(repo, {}).items() if c == commit),
            }
        )
        emit(
            progress,
            MirrorProgress(
                "manifest",
                repo_id=repo,
                commit=commit,
                detail=", ".join(sorted(kernel.variants)),
                manifests=len(report.kernels),
            ),
        )

    now = time.time()
    for repo in sorted({r for r, _c in kernels} | set(refs)):
        branches: dict[str, str] = {}
        tags: dict[str, str] = {}
        old = target.read(refs_path(repo))
        if old is not None:
            try:
                branches, tags = parse_refs(old, repo)
            except MirrorFormatError:
                branches, tags = {}, {}
        before = (dict(branches), dict(tags))
        for ref, commit in refs.get(repo, {}).items():
            (tags if ref in tags else branches)[ref] = commit
        # Unchanged refs keep their bytes (and so the signatures other keys made of them),
        # unless they lack the export time an import needs to refuse a rollback.
        unchanged = old is not None and (branches, tags) == before
        if unchanged and old is not None and parse_refs_exported_at(old) is not None:
            data = old
        else:
            data = refs_json(repo, branches, tags, now)
        write_signed(target, refs_path(repo), data, keys)


def pack_tar(staging: Path, dest: Path) -> None:
    """Write the staging mirror as a tar beside `dest`, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    mtime = int(time.time())
    files = sorted(
        p.relative_to(staging).as_posix()
        for p in staging.rglob("*")
        if p.is_file() and not p.name.startswith(".tmp-")
    )
    # Documents first, blobs last: a reader streaming the tar sees what to expect early.
    files.sort(key=lambda rel: (rel.startswith("blobs/"), rel != INFO, rel))
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in files:
                    path = staging / rel
                    info = tarfile.TarInfo(rel)
                    info.size = path.stat().st_size
                    info.mode = 0o644
                    info.mtime = mtime
                    with path.open("rb") as fh:
                        tar.addfile(info, fh)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unpack_existing(tar_path: Path, staging: Path) -> None:
    """Copy an existing tar mirror into the staging directory (through the import checks)."""
    try:
        with open_bundle(tar_path) as bundle:
            for rel in bundle.files:
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with bundle.open_blob(rel) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
    except (BundleError, tarfile.TarError, EOFError) as exc:
        raise ExportError(
            f"{tar_path} exists but is not a readable kerneld mirror ({exc}); remove it or "
            "choose another name"
        ) from None


def is_tar_destination(dest: str | os.PathLike[str]) -> bool:
    return os.fspath(dest).endswith(".tar")


def export_mirror(
    store: Store,
    dest: str | os.PathLike[str],
    specs: Iterable[ExportSpec],
    *,
    variants: Sequence[str] | None = None,
    sign_keys: Sequence[SigningKey] = (),
    name: str = "",
    progress: ProgressFn | None = None,
) -> ExportReport:
    """Export `specs` from `store` to the mirror directory or `.tar` file `dest`.

    `variants`: None or ["all"] for every variant the store has of each commit, else names
    (those the store lacks are listed in `report.skipped_variants`; a commit with none of them
    is an error). `sign_keys`: every manifest and refs file gets a detached signature by each.
    Raises ExportError (nothing written) when a spec cannot be satisfied from the store.
    """
    dest_path = Path(dest)
    spec_list = list(specs)
    if not spec_list:
        raise ExportError("nothing to export: name kernels or give a lock file")
    kernels, refs, skipped = _plan(store, spec_list, variants)
    report = ExportReport(destination=str(dest_path), skipped_variants=skipped)
    report.signed_by = [k.name for k in sign_keys]
    with _leases(store, kernels):
        if is_tar_destination(dest_path):
            dest_path.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(
                tempfile.mkdtemp(dir=dest_path.parent, prefix=f".{dest_path.name}.staging-")
            )
            try:
                if dest_path.exists():
                    unpack_existing(dest_path, staging)
                target: _Target = DirTarget(staging, name)
                _export_files(store, target, kernels, refs, sign_keys, name, report, progress)
                pack_tar(staging, dest_path)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        else:
            target = DirTarget(dest_path, name)
            _export_files(store, target, kernels, refs, sign_keys, name, report, progress)
    _finished(progress, report, str(dest_path))
    return report


def _finished(progress: ProgressFn | None, report: ExportReport, where: str) -> None:
    emit(
        progress,
        MirrorProgress(
            "finished",
            manifests=len(report.kernels),
            blobs=report.blobs_written,
            bytes_done=report.bytes_written,
            bytes_total=report.bytes_written,
            detail=f"exported {len(report.kernels)} kernel revision(s) to {where}",
        ),
    )


def export_stream(
    store: Store,
    specs: Iterable[ExportSpec],
    send: Callable[[FileOp], None],
    *,
    existing: dict[str, bytes] | None = None,
    present_blobs: Iterable[str] = (),
    label: str = "",
    variants: Sequence[str] | None = None,
    sign_keys: Sequence[SigningKey] = (),
    name: str = "",
    progress: ProgressFn | None = None,
) -> ExportReport:
    """Export `specs` as a stream of files (`send`), for a caller who writes them.

    What the daemon runs for `kerneldctl mirror export`: the file the admin asks for is written
    by the admin's own process (`kerneld.mirror.receive`), wherever the admin may write, and
    the daemon never writes a caller-chosen path. `existing` / `present_blobs` describe the
    caller's destination so the export merges into it and sends only what changes; `label`
    names it in the report.
    """
    spec_list = list(specs)
    if not spec_list:
        raise ExportError("nothing to export: name kernels or give a lock file")
    for rel in existing or {}:
        _check_doc_rel(rel)
    kernels, refs, skipped = _plan(store, spec_list, variants)
    report = ExportReport(destination=label, skipped_variants=skipped)
    report.signed_by = [k.name for k in sign_keys]
    target = StreamTarget(existing or {}, present_blobs, send)
    with _leases(store, kernels):
        _export_files(store, target, kernels, refs, sign_keys, name, report, progress)
    _finished(progress, report, label or "the caller")
    return report


_DOC_RE = re.compile(
    r"^(mirror-info|refs/[^/]+/[^/]+\.json(\.sig)?|manifests/[^/]+/[^/]+/[0-9a-f]{40}\.json(\.sig)?)$"
)
_BLOB_RE = re.compile(r"^blobs/sha256/([0-9a-f]{2})/(\1[0-9a-f]{62})$")


def _check_doc_rel(rel: str) -> None:
    if not _DOC_RE.match(rel) or ".." in rel:
        raise ExportError(f"not a mirror document path: {rel!r}")


def check_stream_path(rel: str) -> str | None:
    """A streamed file's path checked against the mirror layout; the blob's sha256 (which the
    receiver checks the bytes against) for a blob, else None. ValueError for any other path."""
    m = _BLOB_RE.match(rel)
    if m:
        return m.group(2)
    _check_doc_rel(rel)
    return None


@contextmanager
def _leases(store: Store, kernels: dict[tuple[str, str], _Kernel]) -> Iterator[None]:
    """Keep the exported trees from GC while their files are copied."""
    leases = []
    try:
        if not store.read_only:
            for kernel in kernels.values():
                leases += [
                    store.acquire_lease(t, LEASE_S, holder="mirror-export") for t in kernel.trees
                ]
        yield
    finally:
        for lease in leases:
            store.release_lease(lease.id)
