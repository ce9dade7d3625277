"""Verification: re-hash every blob and tree and check that nothing is writable or foreign.

Findings are :class:`Problem` records of five kinds; the report's exit code is a bitmask:

    1  corrupt    content or size differs from the index, a file is missing, a tree has
                  files its manifest does not list
    2  untrusted  wrong owner, wrong mode (anything writable), a symlink, a device, a fifo
    4  io         an I/O error while reading (verification went on past it)

``unknown`` findings (a blob or tree file the index does not know) set no bit: the store never
serves them, since validity is an index row.

``repair`` takes every finding out of service but deletes nothing: the store cannot tell whether
an upstream still has a damaged tree (an air-gapped host has none), so the tree, blob or stray
file is moved into ``v1/quarantine/`` as a :class:`Quarantined` entry that an admin restores
(``kerneldctl verify --restore NAME``: re-hashed, only intact bytes come back) or drops
(``--drop NAME``). An entry whose variants the daemon has fetched again is dropped by itself.
The quarantine is bounded (``store.quarantine.max_bytes``, ``[store] quarantine_max``): an entry
that puts it over the bound drops the oldest entries first, never itself.

Ownership findings name the store's owner, which is the owner of its root directory: after a
``chown`` of the root alone the files still belong to the old owner, and the fix is one
``chown -R``.

Files of a tree that are hard links to a blob verified in the same run are not hashed twice
(same inode, same bytes).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneld_client.vocabulary import is_hex

from .index import Index
from .layout import DIR_MODE_TREE, FILE_MODE_BLOB, Layout, user_name
from .manifest import parse_manifest

log = logging.getLogger("kerneld.store.verify")

CORRUPT = 1
UNTRUSTED = 2
IO_ERROR = 4
#: The quarantine's default bound (``[store] quarantine_max``): it keeps what may be the only
#: copy of a kernel, but a disk that keeps rotting (or a store that is repaired again and again)
#: must not fill the file system the store needs; over it the oldest entries go first.
DEFAULT_QUARANTINE_MAX_BYTES = 1 << 30
_BITS = {"corrupt": CORRUPT, "missing": CORRUPT, "untrusted": UNTRUSTED, "io": IO_ERROR}
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Problem:
    kind: str
    """corrupt, missing, untrusted, io or unknown."""
    object: str
    """blob, tree or store."""
    id: str
    """Blob sha256 / tree digest hex / path for unknown files."""
    path: str
    detail: str


@dataclass(frozen=True)
class Quarantined:
    """One object repair or the scrub moved aside instead of deleting (see the module doc)."""

    name: str
    path: Path
    """The entry's directory (``v1/quarantine/<name>``): the object and ``entry.json``."""
    object: str
    """tree, blob or unknown."""
    id: str
    original: str
    moved: bool
    """False when it could not be moved (owned by another user): it stays at ``original``."""
    variants: tuple[tuple[str, str, str], ...]
    size_bytes: int = 0
    """Apparent size of what it holds (hard links counted once): what the bound counts."""
    reason: str = ""
    """The first problem that put it here, and how many more (one line for listings)."""
    by: str = ""
    """Who took it out of service: repair, scrub or report."""
    quarantined_at: float = 0.0

    @classmethod
    def from_doc(cls, qdir: Path, doc: dict[str, Any]) -> Quarantined:
        variants = tuple(
            (str(v["repo"]), str(v["commit"]), str(v["variant"])) for v in doc.get("variants", [])
        )
        moved = bool(doc.get("moved", False))
        size = doc.get("bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            # Entries written before their size was recorded: measured (once per listing).
            size = entry_bytes(qdir / str(doc.get("object", ""))) if moved else 0
        stamp = doc.get("quarantined_at")
        return cls(
            name=qdir.name,
            path=qdir,
            object=str(doc.get("object", "")),
            id=str(doc.get("id", "")),
            original=str(doc.get("original_path", "")),
            moved=moved,
            variants=variants,
            size_bytes=size,
            reason=_reason(doc.get("why")),
            by=str(doc.get("by", "")),
            quarantined_at=float(stamp) if isinstance(stamp, int | float) else 0.0,
        )

    @property
    def what(self) -> str:
        """What it holds and which variants used it ("tree sha256:... (used by ...)")."""
        what = {"tree": f"tree sha256:{self.id}", "blob": f"blob {self.id}"}.get(
            self.object, f"stray file {self.original}"
        )
        used = ", ".join(f"{r}@{c[:12]}/{v}" for r, c, v in self.variants)
        return f"{what} (used by {used})" if used else what

    def describe(self) -> str:
        """One line for the admin: what, where it went, how to restore or drop it."""
        what = self.what
        if not self.moved:
            return (
                f"{what} taken out of service but not moved (see {self.path}/entry.json): "
                f"it stays at {self.original}; remove it as root"
            )
        restore = f"restore: kerneldctl verify --restore {self.name}; "
        if self.object == "unknown":
            restore = ""
        return (
            f"{what} quarantined, not deleted: kept in {self.path} ({restore}"
            f"drop: kerneldctl verify --drop {self.name}; both with --store and the daemon "
            "stopped)"
        )


def entry_bytes(path: Path) -> int:
    """Apparent size of the files below ``path`` (or of ``path`` itself), each inode once: a
    tree's files are hard links of its blobs, and a tree quarantined with its blob holds the
    bytes once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            st = os.lstat(current)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                stack.extend(current / name for name in os.listdir(current))
            except OSError:
                continue
        elif (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _reason(why: object) -> str:
    """entry.json's ``why`` (a list of problems, or a short text) as one line."""
    if isinstance(why, str):
        return why
    if not isinstance(why, list) or not why:
        return ""
    first = why[0] if isinstance(why[0], dict) else {}
    kind = str(first.get("kind", "?"))
    where = str(first.get("path") or "")
    detail = str(first.get("detail") or "")
    text = f"{kind}: {where}: {detail}" if where else f"{kind}: {detail}"
    return text + (f" (+{len(why) - 1} more)" if len(why) > 1 else "")


@dataclass
class VerifyReport:
    problems: list[Problem] = field(default_factory=list)
    blobs_checked: int = 0
    trees_checked: int = 0
    bytes_hashed: int = 0
    repaired: list[str] = field(default_factory=list)
    invalidated: list[tuple[str, str, str]] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    log_problems: bool = True
    """False for the scrub, which logs only what it confirmed (one line per event)."""

    @property
    def exit_code(self) -> int:
        code = 0
        for p in self.problems:
            code |= _BITS.get(p.kind, 0)
        return code

    @property
    def clean(self) -> bool:
        return not self.problems

    def add(self, kind: str, obj: str, ident: str, path: Path | str, detail: str) -> None:
        self.problems.append(Problem(kind, obj, ident, str(path), detail))
        if self.log_problems:
            log.warning("verify: %s %s %s at %s: %s", kind, obj, ident, path, detail)


def _default_open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)


# Tests replace these to simulate I/O errors.
open_for_hash: Callable[[Path], int] = _default_open
read_chunk: Callable[[int, int], bytes] = os.read


Throttle = Callable[[int], None]
"""Called with the size of every chunk read: the periodic scrub sleeps in it to keep to its
byte rate (and raises there to stop early); a plain ``verify`` passes none."""


def hash_file(path: Path, throttle: Throttle | None = None) -> tuple[str, int, os.stat_result]:
    """(sha256 hex, size, fstat) of a file opened without following symlinks."""
    fd = open_for_hash(path)
    try:
        st = os.fstat(fd)
        h = hashlib.sha256()
        size = 0
        while True:
            chunk = read_chunk(fd, READ_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            if throttle is not None:
                throttle(len(chunk))
        return h.hexdigest(), size, st
    finally:
        os.close(fd)


def _not_owner(st: os.stat_result, owner_uid: int) -> str:
    owner = user_name(owner_uid)
    return (
        f"owned by {user_name(st.st_uid)} (uid {st.st_uid}), not by the store's owner {owner} "
        f"(uid {owner_uid}, the owner of the store root); if the store changed hands, "
        f"`chown -R {owner}: <store root>` as root fixes it"
    )


def _owner_and_mode(st: os.stat_result, owner_uid: int, want_mode: int) -> str | None:
    if st.st_uid != owner_uid:
        return _not_owner(st, owner_uid)
    if st.st_mode & 0o7777 != want_mode:
        return f"mode {st.st_mode & 0o7777:04o}, expected {want_mode:04o}"
    return None


def check_file_trust(st: os.stat_result, owner_uid: int, want_mode: int) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file (type {stat.S_IFMT(st.st_mode):o})"
    return _owner_and_mode(st, owner_uid, want_mode)


def check_dir_trust(st: os.stat_result, owner_uid: int, want_mode: int | None) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != owner_uid:
        return _not_owner(st, owner_uid)
    if want_mode is None:
        if st.st_mode & 0o022:
            return f"mode {st.st_mode & 0o7777:04o} is writable by group or others"
        return None
    if st.st_mode & 0o7777 != want_mode:
        return f"mode {st.st_mode & 0o7777:04o}, expected {want_mode:04o}"
    return None


def verify(layout: Layout, index: Index, owner_uid: int) -> VerifyReport:
    report = VerifyReport()
    for d in (layout.root, layout.base, layout.blobs, layout.trees, layout.locks):
        try:
            problem = check_dir_trust(os.lstat(d), owner_uid, None)
        except OSError as exc:
            kind = "missing" if isinstance(exc, FileNotFoundError) else "io"
            report.add(kind, "store", str(d), d, str(exc))
            continue
        if problem:
            report.add("untrusted", "store", str(d), d, problem)

    good_inodes: dict[str, tuple[int, int]] = {}
    blob_rows = index.blobs()
    known_blobs = {b.sha256 for b in blob_rows}
    for blob in blob_rows:
        if blob.state != "live":
            continue
        inode = verify_blob(layout, blob.sha256, blob.size, owner_uid=owner_uid, report=report)
        if inode is not None:
            good_inodes[blob.sha256] = inode

    tree_rows = index.trees()
    for tree in tree_rows:
        if tree.state != "live":
            continue
        report.trees_checked += 1
        _verify_tree(
            layout,
            digest=tree.digest,
            manifest=tree.manifest,
            owner_uid=owner_uid,
            good_inodes=good_inodes,
            report=report,
        )

    _find_unknown(layout, known_blobs, {t.digest for t in tree_rows}, report)
    return report


def verify_blob(
    layout: Layout,
    sha256: str,
    size: int,
    *,
    owner_uid: int,
    report: VerifyReport,
    throttle: Throttle | None = None,
    known_inode: tuple[int, int] | None = None,
) -> tuple[int, int] | None:
    """Check one live blob; its (st_dev, st_ino) when it is intact, else None (problems are
    added to ``report``). ``known_inode``: an inode whose bytes were already hashed correctly
    in this run (a tree file hard-linked to the blob), so only trust is checked."""
    report.blobs_checked += 1
    path = layout.blob_path(sha256)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        report.add("missing", "blob", sha256, path, "blob file is missing")
        return None
    except OSError as exc:
        report.add("io", "blob", sha256, path, str(exc))
        return None
    problem = check_file_trust(st, owner_uid, FILE_MODE_BLOB)
    if problem:
        report.add("untrusted", "blob", sha256, path, problem)
        return None
    if known_inode is not None and known_inode == (st.st_dev, st.st_ino) and st.st_size == size:
        return known_inode
    try:
        digest, got_size, fst = hash_file(path, throttle)
    except OSError as exc:
        report.add("io", "blob", sha256, path, f"read failed: {exc}")
        return None
    report.bytes_hashed += got_size
    if got_size != size:
        report.add("corrupt", "blob", sha256, path, f"size {got_size}, expected {size}")
        return None
    if digest != sha256:
        report.add("corrupt", "blob", sha256, path, f"content hashes to {digest}")
        return None
    return (fst.st_dev, fst.st_ino)


def verify_tree(
    layout: Layout,
    *,
    digest: str,
    manifest: bytes,
    owner_uid: int,
    report: VerifyReport,
    throttle: Throttle | None = None,
    hashed_inodes: dict[str, tuple[int, int]] | None = None,
) -> None:
    """Check one live tree against its manifest (the scrub's unit of work).

    ``hashed_inodes`` collects, per blob sha256, the inode of a tree file that hashed
    correctly, so the blob it is hard-linked to need not be read again.
    """
    report.trees_checked += 1
    _verify_tree(
        layout,
        digest=digest,
        manifest=manifest,
        owner_uid=owner_uid,
        good_inodes={},
        report=report,
        throttle=throttle,
        hashed_inodes=hashed_inodes,
    )


def _verify_tree(
    layout: Layout,
    *,
    digest: str,
    manifest: bytes,
    owner_uid: int,
    good_inodes: dict[str, tuple[int, int]],
    report: VerifyReport,
    throttle: Throttle | None = None,
    hashed_inodes: dict[str, tuple[int, int]] | None = None,
) -> None:
    root = layout.tree_path(digest)
    entries = {e.path: e for e in parse_manifest(manifest)}
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        report.add("missing", "tree", digest, root, "tree directory is missing")
        return
    except OSError as exc:
        report.add("io", "tree", digest, root, str(exc))
        return
    problem = check_dir_trust(st, owner_uid, DIR_MODE_TREE)
    if problem:
        report.add("untrusted", "tree", digest, root, problem)
        return
    seen: set[str] = set()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as it:
                items = list(it)
        except OSError as exc:
            report.add("io", "tree", digest, root / rel_dir, str(exc))
            continue
        for item in items:
            rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
            full = root / rel
            try:
                est = os.lstat(full)
            except OSError as exc:
                report.add("io", "tree", digest, full, str(exc))
                continue
            if stat.S_ISDIR(est.st_mode):
                problem = check_dir_trust(est, owner_uid, DIR_MODE_TREE)
                if problem:
                    report.add("untrusted", "tree", digest, full, problem)
                stack.append(rel)
                continue
            entry = entries.get(rel)
            if entry is None:
                kind = "untrusted" if not stat.S_ISREG(est.st_mode) else "corrupt"
                report.add(kind, "tree", digest, full, "file not in the tree's manifest")
                continue
            seen.add(rel)
            problem = check_file_trust(est, owner_uid, entry.mode)
            if problem:
                report.add("untrusted", "tree", digest, full, problem)
                continue
            if good_inodes.get(entry.sha256) == (est.st_dev, est.st_ino):
                continue
            try:
                got, size, fst = hash_file(full, throttle)
            except OSError as exc:
                report.add("io", "tree", digest, full, f"read failed: {exc}")
                continue
            report.bytes_hashed += size
            if size != entry.size or got != entry.sha256:
                report.add("corrupt", "tree", digest, full, "content differs from the manifest")
            elif hashed_inodes is not None:
                hashed_inodes[entry.sha256] = (fst.st_dev, fst.st_ino)
    for rel in sorted(set(entries) - seen):
        report.add("missing", "tree", digest, root / rel, "file listed in the manifest is missing")


def _find_unknown(
    layout: Layout, known_blobs: set[str], known_trees: set[str], report: VerifyReport
) -> None:
    try:
        buckets = list(os.scandir(layout.blobs))
    except OSError as exc:
        report.add("io", "store", "blobs", layout.blobs, str(exc))
        buckets = []
    for bucket in buckets:
        if not (bucket.is_dir(follow_symlinks=False) and is_hex(bucket.name, 2)):
            report.add("unknown", "store", bucket.path, bucket.path, "not a blob bucket")
            continue
        try:
            names = os.listdir(bucket.path)
        except OSError as exc:
            report.add("io", "store", bucket.path, bucket.path, str(exc))
            continue
        for name in names:
            if name not in known_blobs or not name.startswith(bucket.name):
                path = os.path.join(bucket.path, name)
                report.add("unknown", "store", path, path, "file not in the index")
    try:
        tree_names = os.listdir(layout.trees)
    except OSError as exc:
        report.add("io", "store", "trees", layout.trees, str(exc))
        tree_names = []
    for name in tree_names:
        if name not in known_trees:
            tree_dir = layout.trees / name
            report.add("unknown", "store", str(tree_dir), tree_dir, "tree not in the index")
