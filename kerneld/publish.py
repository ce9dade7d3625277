"""Publish a kernel author's local build so kerneld serves it: `kerneldctl publish`.

The input is what the kernel builder leaves on disk: `build/<variant>/...`, each variant folder
holding the Python package, the compiled `.so` and a `metadata.json` whose `digest` lists every
other file's hash. Nothing upstream has checked such a build, so it is checked here the way the
store checks a variant it fetched (`kerneld.store.paths` for names and file types,
`kerneld.store.manifest` for `metadata.json` and its digest), all of it before anything is written.
Bytecode (`__pycache__`, `.pyc`) is left out, as every upstream leaves it out.

It is then written either

- into a mirror directory (or `.tar`) in the layout of `kerneld.mirror.documents`, merged with what
  is there exactly as `kerneldctl mirror export` merges (blobs first, then the manifest, then the
  refs; signed with the same keys), so a daemon's `mirror-dir` upstream serves it and
  `kerneldctl mirror import` takes it; or
- straight into a store (its daemon stopped), through the store's verified ingest and
  `publish_tree`, as a mirror import would.

Two rules keep daemons that already cached something correct. A commit's files never change in
kerneld (a daemon keeps the trees of a commit it fetched), so a variant already published under
the same commit with other files is refused. A ref only moves to a commit that descends from the
one it points at (git ancestry in the author's checkout), unless forced, so publishing an older
build never rolls `v1` back by accident.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kerneld.mirror.documents import (
    INFO,
    Manifest,
    MirrorFormatError,
    blob_path,
    info_json,
    manifest_path,
    parse_info,
    parse_refs,
    parse_refs_exported_at,
    refs_json,
    refs_path,
)
from kerneld.mirror.export import (
    DirTarget,
    ExportError,
    is_tar_destination,
    pack_tar,
    unpack_existing,
    write_signed,
)
from kerneld.mirror.keys import SigningKey, sig_path
from kerneld.store import MetadataDigestError, MetadataError, Store, StoreError, TreeFile
from kerneld.store.layout import FILE_MODE_EXEC
from kerneld.store.manifest import (
    MAX_METADATA_BYTES,
    METADATA_FILE,
    ManifestEntry,
    VariantMetadata,
    check_metadata_digest,
    parse_metadata,
    tree_digest,
)
from kerneld.store.paths import (
    check_unique_paths,
    normalize_mode,
    validate_commit,
    validate_ref,
    validate_relpath,
    validate_repo,
    validate_variant,
)
from kerneld.upstream.base import RemoteFile, check_repo_id, is_commit, skipped

CHUNK = 1 << 20
BUILD_DIR = "build"
#: `is_ancestor(older, newer)`: True/False, or None when it cannot be told (unknown commit).
Ancestry = Callable[[str, str], bool | None]


class PublishError(ValueError):
    """The build cannot be published as asked; nothing was written. `hint` says what to do."""

    def __init__(self, message: str, *, hint: str = "", usage: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.usage = usage
        """A mistake in the arguments rather than in the build (kerneldctl's exit code 2)."""


def check_names(repo_id: str, refs: Sequence[str]) -> None:
    """Repo id and ref names, checked as the store and the mirror layout check them."""
    try:
        validate_repo(repo_id)
        check_repo_id(repo_id)
        for ref in refs:
            validate_ref(ref, repo_id=repo_id)
    except (StoreError, ValueError) as exc:
        raise PublishError(str(exc), usage=True) from None
    for ref in refs:
        if is_commit(ref):
            raise PublishError(
                f"--ref takes a branch or tag name, not a commit: {ref!r}", usage=True
            )


def check_commit(commit: str) -> str:
    commit = commit.strip().lower()
    if len(commit) == 64 and all(c in "0123456789abcdef" for c in commit):
        raise PublishError(
            f"sha256 commit ids are not supported ({commit}); kerneld names revisions by "
            "40-hex sha1 commit ids",
            usage=True,
        )
    try:
        return validate_commit(commit)
    except StoreError:
        raise PublishError(
            f"--commit takes a full commit id (40 hex digits), got {commit!r}", usage=True
        ) from None


# ---- the build on disk -------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    path: str
    """Relative to the variant folder, as it will be in the tree."""
    source: Path
    size: int
    sha256: str
    mode: int
    """The tree mode: FILE_MODE_BLOB or FILE_MODE_EXEC."""

    @property
    def executable(self) -> bool:
        return self.mode == FILE_MODE_EXEC


@dataclass(frozen=True)
class LocalVariant:
    name: str
    folder: Path
    files: tuple[LocalFile, ...]
    metadata: VariantMetadata
    tree_digest: str
    """`sha256:<hex>`: the digest the store will give the tree (`kerneldctl info` shows it)."""
    skipped: tuple[str, ...] = ()
    """Bytecode left out."""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.name,
            "folder": str(self.folder),
            "files": len(self.files),
            "bytes": self.size,
            "tree_digest": self.tree_digest,
            "skipped": list(self.skipped),
        }


def variant_folders(path: Path) -> list[Path]:
    """The variant folders `path` names: `path/build/*`, `build/*` itself, or one variant."""
    if not path.exists():
        raise PublishError(f"{path} does not exist")
    if not path.is_dir():
        raise PublishError(
            f"{path} is not a folder",
            hint="give the kernel's repo folder (the one holding build/) or one build/<variant>",
        )
    build = path / BUILD_DIR
    if (path / METADATA_FILE).exists():
        return [path]
    if not build.is_dir() and path.name == BUILD_DIR:
        build = path
    if not build.is_dir():
        raise PublishError(
            f"{path} has no {BUILD_DIR}/ folder and is not a variant folder (it has no "
            f"{METADATA_FILE})",
            hint="build the kernel first (the kernel builder writes build/<variant>/...), then "
            "give the kernel's repo folder or one build/<variant> folder",
        )
    folders: list[Path] = []
    for entry in sorted(build.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            raise PublishError(
                f"{entry} is a symlink; a variant is a real folder (the store refuses links)",
                hint="replace the link with the folder it points at",
            )
        if entry.is_dir():
            folders.append(entry)
    if not folders:
        raise PublishError(
            f"{build} holds no variant folders",
            hint="build the kernel first: each build/<variant> folder is one variant",
        )
    return folders


def _open_regular(path: Path) -> IO[bytes]:
    """Open a build file for reading: never through a symlink, never a fifo or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise PublishError(f"{path} is not a regular file")
    return fh


def _hash(path: Path, algorithm: str = "sha256") -> tuple[str, int]:
    h = hashlib.new(algorithm)
    n = 0
    with _open_regular(path) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _walk(
    folder: Path, ctx: dict[str, str | None]
) -> tuple[list[tuple[str, Path, int]], list[str]]:
    """(relative path, file, tree mode) of every file to publish, and the bytecode left out.

    Names and file types go through the store's own checks: a symlink, fifo or device, or a
    name the store would refuse, is refused here with the store's message."""
    found: list[tuple[str, Path, int]] = []
    left_out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        for name in sorted(dirnames):
            full = here / name
            rel = full.relative_to(folder).as_posix()
            if skipped(rel):
                dirnames.remove(name)
                left_out.append(rel + "/")
            elif full.is_symlink():
                normalize_mode(full.lstat().st_mode, validate_relpath(rel, **ctx), **ctx)
        dirnames.sort()
        for name in sorted(filenames):
            full = here / name
            rel = full.relative_to(folder).as_posix()
            if skipped(rel):
                left_out.append(rel)
                continue
            validate_relpath(rel, **ctx)
            st_mode = full.lstat().st_mode
            # setuid/setgid/sticky bits are not part of a tree: only the type and rwx count
            mode = normalize_mode(stat.S_IFMT(st_mode) | (st_mode & 0o777), rel, **ctx)
            found.append((rel, full, mode))
    check_unique_paths((rel for rel, _p, _m in found), **ctx)
    return found, left_out


def check_variant(folder: Path, *, repo_id: str, commit: str | None = None) -> LocalVariant:
    """Hash and check one variant folder; PublishError (with the store's message) if anything
    would make the store refuse it: bad names or file types, no or malformed metadata.json, a
    digest that does not describe exactly the folder's files."""
    name = folder.name
    ctx: dict[str, str | None] = {"repo_id": repo_id, "commit": commit, "variant": name}
    try:
        validate_variant(name, repo_id=repo_id, commit=commit)
        found, left_out = _walk(folder, ctx)
        if not any(rel == METADATA_FILE for rel, _p, _m in found):
            raise PublishError(
                f"variant {name} ({folder}) has no {METADATA_FILE}",
                hint=f"every build/<variant> folder needs the {METADATA_FILE} the kernel builder "
                "writes (id, name, version, backend, digest): rebuild that variant, or remove "
                "the folder if it is not one",
            )
        files: list[LocalFile] = []
        for rel, path, mode in found:
            sha, size = _hash(path)
            files.append(LocalFile(rel, path, size, sha, mode))
        by_path = {f.path: ManifestEntry(f.path, f.mode, f.size, f.sha256) for f in files}
        sources = {f.path: f.source for f in files}
        with _open_regular(sources[METADATA_FILE]) as fh:
            raw = fh.read(MAX_METADATA_BYTES + 1)
        doc, meta = parse_metadata(raw, **ctx)

        def hash_file(algorithm: str, path: str) -> bytes:
            return bytes.fromhex(_hash(sources[path], algorithm)[0])

        # The digest is mandatory here: it is the author's own statement of what the build is.
        check_metadata_digest(doc, by_path, hash_file, require=True, **ctx)
    except MetadataDigestError as exc:
        raise PublishError(str(exc)) from None  # its message says to re-run the hash step
    except MetadataError as exc:
        raise PublishError(
            str(exc), hint=f"{METADATA_FILE} is the kernel builder's: rebuild the variant"
        ) from None
    except StoreError as exc:
        raise PublishError(str(exc)) from None
    except OSError as exc:
        raise PublishError(f"cannot read {folder}: {exc.strerror or exc}") from None
    return LocalVariant(
        name=name,
        folder=folder,
        files=tuple(sorted(files, key=lambda f: f.path.encode())),
        metadata=meta,
        tree_digest=tree_digest(by_path.values()),
        skipped=tuple(left_out),
    )


# ---- git ---------------------------------------------------------------------------------------


class GitCheckout:
    """The author's git checkout around the build: its HEAD, whether it is clean, and which of
    two commits is newer (for refs that must only move forward)."""

    def __init__(self, top: Path) -> None:
        self.top = top

    @staticmethod
    def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        # No optional locks: `git status` must not rewrite the index of a publish that writes
        # nothing; C locale: the messages are matched below.
        env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
        return subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    @classmethod
    def find(cls, path: Path) -> GitCheckout | None:
        """The checkout `path` is in; None when it is in none (or git is not installed)."""
        try:
            proc = cls._run(path, "rev-parse", "--show-toplevel")
        except FileNotFoundError:
            return None
        if proc.returncode == 0:
            return cls(Path(proc.stdout.strip()))
        if "not a git repository" in proc.stderr:
            return None
        raise PublishError(
            f"git cannot read the checkout around {path}: {proc.stderr.strip()}",
            hint="run kerneldctl publish as the checkout's owner (git refuses repositories "
            "other users own), or publish a copy of the build made outside the checkout with "
            "--commit",
        )

    def head(self) -> str:
        proc = self._run(self.top, "rev-parse", "--verify", "-q", "HEAD^{commit}")
        if proc.returncode != 0:
            raise PublishError(
                f"the git checkout {self.top} has no commit yet",
                hint="commit the kernel's sources (and build/, if the repo tracks it) first",
            )
        return proc.stdout.strip()

    def changes(self, exclude: Sequence[Path] = ()) -> list[str]:
        """`git status --porcelain` lines: uncommitted changes and untracked files, except
        below `exclude` (the publish's own destination, when it is inside the checkout)."""
        spec = ["--", "."]
        for path in exclude:
            resolved = path.resolve()
            if resolved == self.top.resolve() or self.top.resolve() in resolved.parents:
                spec.append(f":(exclude){resolved.relative_to(self.top.resolve()).as_posix()}")
        proc = self._run(self.top, "status", "--porcelain", "--untracked-files=normal", *spec)
        if proc.returncode != 0:
            raise PublishError(f"git status failed in {self.top}: {proc.stderr.strip()}")
        return [line for line in proc.stdout.splitlines() if line.strip()]

    def is_ancestor(self, older: str, newer: str) -> bool | None:
        proc = self._run(self.top, "merge-base", "--is-ancestor", older, newer)
        if proc.returncode in (0, 1):
            return proc.returncode == 0
        return None  # a commit this checkout does not have


@dataclass(frozen=True)
class Revision:
    commit: str
    checkout: GitCheckout | None
    dirty: list[str] = field(default_factory=list)
    """The uncommitted changes published anyway (--allow-dirty)."""

    def ancestry(self) -> Ancestry | None:
        return self.checkout.is_ancestor if self.checkout is not None else None


def resolve_revision(path: Path, commit: str | None) -> Revision:
    """The commit the build at `path` is published as: HEAD of its git checkout, or `commit`
    outside one (a commit is required there; inside one it must be HEAD, since the dirty-tree
    check says nothing about another commit)."""
    checkout = GitCheckout.find(path)
    if checkout is None:
        if commit is None:
            raise PublishError(
                f"{path} is not in a git checkout, so its commit cannot be read",
                hint="give the commit this build is of with --commit (40 hex digits)",
                usage=True,
            )
        return Revision(check_commit(commit), None)
    head = checkout.head()
    if commit is not None and check_commit(commit) != head:
        raise PublishError(
            f"{path} is in the git checkout {checkout.top}, whose HEAD is {head}, not {commit}",
            hint=f"check out {commit} and build it, drop --commit to publish {head}, or publish "
            "a copy of the build made outside the checkout",
            usage=True,
        )
    return Revision(check_commit(head), checkout)


def check_clean(
    revision: Revision, *, allow_dirty: bool, destination: Path | None = None
) -> Revision:
    """Refuse a checkout with uncommitted changes: the commit id would not describe the build.
    `destination` (a mirror or store inside the checkout) does not count as a change."""
    if revision.checkout is None:
        return revision
    changes = revision.checkout.changes([destination] if destination is not None else [])
    if not changes:
        return revision
    if allow_dirty:
        return Revision(revision.commit, revision.checkout, changes)
    shown = "\n  ".join(changes[:10]) + ("\n  ..." if len(changes) > 10 else "")
    raise PublishError(
        f"the git checkout {revision.checkout.top} has uncommitted changes, so commit "
        f"{revision.commit} does not describe this build:\n  {shown}",
        hint="commit them (a new commit for the new build), or pass --allow-dirty to publish "
        f"the build as {revision.commit} anyway",
    )


# ---- refs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefMove:
    ref: str
    commit: str
    previous: str | None
    action: str
    """set (new ref, or a forward move) | unchanged | forced (moved back or sideways)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "commit": self.commit,
            "previous": self.previous,
            "action": self.action,
        }


def plan_ref(
    ref: str,
    current: str | None,
    commit: str,
    ancestry: Ancestry | None,
    *,
    force: bool,
) -> RefMove:
    """Where `ref` goes: forward only (`current` is an ancestor of `commit`), unless `force`."""
    if current is None:
        return RefMove(ref, commit, None, "set")
    if current == commit:
        return RefMove(ref, commit, current, "unchanged")
    forward = ancestry(current, commit) if ancestry is not None else None
    if forward:
        return RefMove(ref, commit, current, "set")
    if force:
        return RefMove(ref, commit, current, "forced")
    backward = ancestry(commit, current) if ancestry is not None else None
    if backward:
        why = f"a newer commit (it descends from {commit}): --ref {ref} would move {ref} back"
    elif forward is False and backward is False:
        why = f"which is not an ancestor of {commit} (the histories diverged)"
    elif ancestry is None:
        why = f"and outside a git checkout it cannot be told whether {commit} is newer"
    else:
        why = f"which this checkout does not have, so it cannot be told whether {commit} is newer"
    raise PublishError(
        f"{ref} points at {current}, {why}",
        hint=f"drop --ref {ref} to publish {commit} without moving it, or pass --force-refs "
        f"to move {ref} anyway (a rollback)",
    )


# ---- reports -----------------------------------------------------------------------------------


@dataclass
class PublishReport:
    repo_id: str
    commit: str
    destination: str
    target: str
    """mirror | store"""
    variants: list[LocalVariant]
    refs: list[RefMove]
    signed_by: list[str] = field(default_factory=list)
    blobs_written: int = 0
    blobs_present: int = 0
    bytes_written: int = 0
    unchanged: list[str] = field(default_factory=list)
    """Variants that were already published with exactly these files."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "repo_id": self.repo_id,
            "commit": self.commit,
            "destination": self.destination,
            "target": self.target,
            "variants": [v.to_dict() for v in self.variants],
            "unchanged_variants": self.unchanged,
            "refs": [r.to_dict() for r in self.refs],
            "signed_by": self.signed_by,
            "blobs_written": self.blobs_written,
            "blobs_present": self.blobs_present,
            "bytes_written": self.bytes_written,
        }


def _same_files(variant: LocalVariant, files: Sequence[RemoteFile], execs: frozenset[str]) -> bool:
    have = {(f.path, f.size, f.sha256, f.executable) for f in variant.files}
    there = {(f.path, f.size, f.sha256, f.path in execs) for f in files}
    return have == there


def _immutable(repo_id: str, commit: str, variant: str, where: str) -> PublishError:
    return PublishError(
        f"{repo_id}@{commit} [{variant}] is already in {where} with other files; a commit's "
        "files never change in kerneld (daemons keep the ones they fetched)",
        hint="commit the change and publish the new commit",
    )


# ---- mirror ------------------------------------------------------------------------------------


def _copy_blob(root: Path, f: LocalFile) -> int:
    """Copy one build file into the mirror's blobs, re-hashing it (it must not have changed since
    it was checked); atomic, as every mirror file."""
    dest = root / blob_path(f.sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    h = hashlib.sha256()
    n = 0
    try:
        with os.fdopen(fd, "wb") as out:
            with _open_regular(f.source) as src:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != f.sha256 or n != f.size:
            raise PublishError(
                f"{f.source} changed while it was being published; no manifest names it",
                hint="publish again once the build has finished",
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


@dataclass
class _MirrorPlan:
    manifest_rel: str
    manifest: bytes
    refs_rel: str
    refs: bytes
    write_info: bool


def _plan_mirror(
    target: DirTarget,
    variants: Sequence[LocalVariant],
    repo_id: str,
    commit: str,
    refs: Sequence[str],
    ancestry: Ancestry | None,
    *,
    force_refs: bool,
    signing: bool,
    report: PublishReport,
) -> _MirrorPlan:
    """Everything the mirror will hold for this publish, decided before anything is written."""
    where = f"the mirror {report.destination}"
    info = target.read(INFO)
    if info is not None:
        try:
            parse_info(info)
        except MirrorFormatError as exc:
            raise PublishError(f"{report.destination}: {exc}") from None

    new = Manifest(
        repo_id,
        commit,
        {v.name: [RemoteFile(f.path, f.size, sha256=f.sha256) for f in v.files] for v in variants},
        {
            v.name: frozenset(f.path for f in v.files if f.executable)
            for v in variants
            if any(f.executable for f in v.files)
        },
    )
    m_rel = manifest_path(repo_id, commit)
    old_raw = target.read(m_rel)
    merged = new
    if old_raw is not None:
        try:
            old = Manifest.from_json(old_raw, repo_id=repo_id, commit=commit)
        except MirrorFormatError as exc:
            raise PublishError(
                f"{where} holds a manifest of {repo_id}@{commit} that cannot be read: {exc}",
                hint=f"remove {m_rel} from the mirror, or publish into another mirror",
            ) from None
        for v in variants:
            if v.name in old.variants:
                if not _same_files(
                    v, old.variants[v.name], old.executables.get(v.name, frozenset())
                ):
                    raise _immutable(repo_id, commit, v.name, where)
                report.unchanged.append(v.name)
        execs = {k: s for k, s in old.executables.items() if k not in new.variants}
        execs.update(new.executables)
        merged = Manifest(repo_id, commit, {**old.variants, **new.variants}, execs)

    r_rel = refs_path(repo_id)
    old_refs = target.read(r_rel)
    branches: dict[str, str] = {}
    tags: dict[str, str] = {}
    if old_refs is not None:
        try:
            branches, tags = parse_refs(old_refs, repo_id)
        except MirrorFormatError as exc:
            raise PublishError(
                f"{where} holds refs of {repo_id} that cannot be read: {exc}",
                hint=f"remove {r_rel} from the mirror, or publish into another mirror",
            ) from None
    before = (dict(branches), dict(tags))
    for ref in refs:
        table = tags if ref in tags else branches
        move = plan_ref(ref, table.get(ref), commit, ancestry, force=force_refs)
        report.refs.append(move)
        table[ref] = commit
    unchanged = old_refs is not None and (branches, tags) == before
    if unchanged and old_refs is not None and parse_refs_exported_at(old_refs) is not None:
        refs_data = old_refs  # unchanged: keep the bytes, and the signatures made of them
    else:
        refs_data = refs_json(repo_id, branches, tags, time.time())

    manifest_data = merged.to_json()
    if not signing:
        for rel, was, data in ((m_rel, old_raw, manifest_data), (r_rel, old_refs, refs_data)):
            if was != data and target.read(sig_path(rel)) is not None:
                raise PublishError(
                    f"{where} signs {rel}; publishing without a key would leave it unsigned, "
                    "and daemons that require signatures would stop serving "
                    f"{repo_id}",
                    hint="sign with the mirror's key: --sign-key NAME (and --key-dir DIR)",
                )
    return _MirrorPlan(m_rel, manifest_data, r_rel, refs_data, info is None)


@contextmanager
def _mirror_root(dest: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """The directory to write (a `.tar` destination: a staging directory beside it, seeded with
    the tar's contents) and the call that makes it final."""
    if not is_tar_destination(dest):
        yield dest, lambda: None
        return
    if dest.is_dir():
        raise PublishError(f"{dest} is a directory; a .tar destination must be a file")
    if not dest.parent.is_dir():
        raise PublishError(f"{dest.parent} does not exist: create the directory first")
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.staging-"))
    try:
        if dest.exists():
            try:
                unpack_existing(dest, staging)
            except ExportError as exc:
                raise PublishError(str(exc)) from None
        yield staging, lambda: pack_tar(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_to_mirror(
    variants: Sequence[LocalVariant],
    dest: Path,
    *,
    repo_id: str,
    commit: str,
    refs: Sequence[str] = (),
    ancestry: Ancestry | None = None,
    force_refs: bool = False,
    sign_keys: Sequence[SigningKey] = (),
    name: str = "",
) -> PublishReport:
    """Add the checked `variants` of `repo_id@commit` to the mirror directory (or `.tar`) `dest`.

    An existing mirror is extended: its other kernels, commits and variants stay, refs merge,
    and an unchanged document keeps its bytes and only gains signatures. `refs` point at
    `commit` (forward only unless `force_refs`, see `plan_ref`). PublishError before any write
    when the build, the refs or the mirror forbid it.
    """
    report = PublishReport(repo_id, commit, str(dest), "mirror", list(variants), [])
    report.signed_by = [k.name for k in sign_keys]
    with _mirror_root(dest) as (root, finish):
        try:
            target = DirTarget(root, name)
        except ExportError as exc:
            raise PublishError(str(exc)) from None
        plan = _plan_mirror(
            target,
            variants,
            repo_id,
            commit,
            refs,
            ancestry,
            force_refs=force_refs,
            signing=bool(sign_keys),
            report=report,
        )
        # Writes, in the order an export writes: info, blobs, the manifest, then the refs.
        if plan.write_info:
            target.write(INFO, info_json(name))
        blobs = {f.sha256: f for v in variants for f in v.files}
        for sha, f in sorted(blobs.items()):
            if target.has_blob(sha, f.size):
                report.blobs_present += 1
                continue
            report.bytes_written += _copy_blob(root, f)
            report.blobs_written += 1
        write_signed(target, plan.manifest_rel, plan.manifest, sign_keys)
        write_signed(target, plan.refs_rel, plan.refs, sign_keys)
        finish()
    return report


# ---- store -------------------------------------------------------------------------------------


def publish_to_store(
    store: Store,
    variants: Sequence[LocalVariant],
    *,
    repo_id: str,
    commit: str,
    refs: Sequence[str] = (),
    ancestry: Ancestry | None = None,
    force_refs: bool = False,
) -> PublishReport:
    """Ingest and publish the checked `variants` of `repo_id@commit` into `store` (opened
    read-write: its daemon is stopped), then point `refs` at it (forward only unless
    `force_refs`). The store verifies every byte again on ingest and re-checks metadata.json."""
    report = PublishReport(repo_id, commit, str(store.root), "store", list(variants), [])
    where = f"the store {store.root}"
    try:
        store.check_denied(repo_id, commit, commit)
    except StoreError as exc:
        raise PublishError(str(exc), hint=f"`kerneldctl allow {repo_id}` lifts a deny") from None
    for v in variants:
        tree = store.published_tree(repo_id, commit, v.name)
        if tree is not None:
            if f"sha256:{tree.digest}" != v.tree_digest:
                raise _immutable(repo_id, commit, v.name, where)
            report.unchanged.append(v.name)
    for ref in refs:
        current = store.get_ref(repo_id, ref)
        report.refs.append(
            plan_ref(ref, current.commit if current else None, commit, ancestry, force=force_refs)
        )
    ctx = {"repo_id": repo_id, "commit": commit}
    seen: set[str] = set()
    try:
        with store.holds.hold() as hold:
            for v in variants:
                for f in v.files:
                    if f.sha256 in seen:
                        continue
                    seen.add(f.sha256)
                    if store.has_blob(f.sha256):
                        report.blobs_present += 1
                        continue
                    store.ingest_file(f.source, sha256=f.sha256, size=f.size, variant=v.name, **ctx)
                    report.blobs_written += 1
                    report.bytes_written += f.size
                hold.add(repo_id, commit, v.name)
                published = store.publish_tree(
                    repo_id,
                    commit,
                    v.name,
                    [
                        TreeFile(
                            path=f.path,
                            sha256=f.sha256,
                            size=f.size,
                            mode=0o100755 if f.executable else 0o100644,
                            upstream_id=f.sha256,
                        )
                        for f in v.files
                    ],
                )
                if published.digest != v.tree_digest:  # pragma: no cover - one definition
                    raise PublishError(
                        f"{v.name}: the store made {published.digest}, not the tree checked"
                    )
            for move in report.refs:
                if move.action != "unchanged":
                    store.set_ref(repo_id, move.ref, commit)
    except StoreError as exc:
        raise PublishError(f"publishing into {where} failed: {exc}") from None
    except OSError as exc:
        raise PublishError(
            f"publishing into {where} failed: {exc.strerror or exc}",
            hint="a build file changed or vanished while it was published: publish again",
        ) from None
    return report


def summary(report: PublishReport) -> list[str]:
    """Human lines for a finished publish."""
    lines = [
        f"published {report.repo_id}@{report.commit} ({len(report.variants)} variant(s)) to "
        f"{report.target} {report.destination}"
    ]
    for v in report.variants:
        state = " (already there)" if v.name in report.unchanged else ""
        lines.append(f"  {v.name}: {len(v.files)} files, {v.size} bytes, {v.tree_digest}{state}")
        if v.skipped:
            lines.append(f"    left out (bytecode): {', '.join(v.skipped)}")
    for move in report.refs:
        text = {
            "set": "set" if move.previous is None else f"moved from {move.previous}",
            "unchanged": "unchanged",
            "forced": f"moved back from {move.previous} (--force-refs)",
        }[move.action]
        lines.append(f"  ref {move.ref} -> {move.commit}: {text}")
    if report.signed_by:
        lines.append(f"  signed by {', '.join(report.signed_by)}")
    return lines
