"""On-disk layout of a store (layout version 1).

::

    <root>/                              0755, owned by the store owner
    ├── owner.lock                       0600  exclusive flock of the owning process; holds its pid
    │                                          (private: anyone who can open it could hold it)
    ├── v1/                              0755  layout version 1 (a new layout gets a new folder)
    │   ├── index.sqlite3                0600  the index (SQLite, WAL); validity lives here
    │   ├── blobs/sha256/<2 hex>/<64 hex>  0444  immutable content, addressed by sha256
    │   ├── trees/<64 hex>/...           0555 dirs / 0444 (or 0555) files: published variant
    │   │                                       trees, named by their tree digest
    │   └── tmp/                         0700  invisible work in progress, cleaned at open
    │       ├── ingest/<algo>-<hex>.part        resumable partial downloads (kept for a grace
    │       │                                   period, then deleted)
    │       ├── staging/<random>/               trees being built (always deleted at open)
    │       └── trash/<random>                  trees/blobs being deleted (always deleted at open)
    │   └── quarantine/                  0700  what repair, the scrub or a confirmed report took
    │       └── <time>-<tree|blob|unknown>-<id>/  out of service but could not prove replaceable:
    │           ├── tree/ | blob | unknown        the object as it was found, and entry.json (why,
    │           └── entry.json                    which variants, the manifest, its size, who
    │                                             reported it); restored or dropped by an admin,
    │                                             the oldest dropped past [store] quarantine_max
    ├── locks/<64 hex>.lock              0644  one per published tree; clients hold an OFD read
    │                                          lock, GC the OFD write lock (owner only)
    └── index/v1/                        0755  the published index, read by jobs
                                               (published_index.py)
        ├── denies.json
        └── <org>/<name>.json

Nothing here is trusted by existence alone: a blob or tree is valid only while the index has a
``live`` row for it.

Ownership: the store belongs to the owner of its root directory, and every file in it must be
owned by that user. Opening a store read-write therefore needs that uid (``check_root``): after
``chown -R kerneld: <root>`` the store simply belongs to ``kerneld``, there is no other record to
fix. A directory above the root that others may write without the sticky bit would let them
swap the store for their own, so it is refused too.
"""

from __future__ import annotations

import os
import pwd
import shlex
import stat
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import StoreOwnershipError

LAYOUT_VERSION = 1

DIR_MODE_PUBLIC = 0o755
DIR_MODE_PRIVATE = 0o700
DIR_MODE_TREE = 0o555
FILE_MODE_BLOB = 0o444
FILE_MODE_EXEC = 0o555
FILE_MODE_LOCK = 0o644
"""Tree lock files: readable by every client (OFD read lock), writable only by the store owner
(the OFD write lock GC takes needs a writable descriptor, so no other user can hold it)."""
FILE_MODE_PUBLIC = 0o644
FILE_MODE_DB = 0o600


@dataclass(frozen=True)
class Layout:
    """Every path of a store, derived from its root. Pure: creates nothing except in ``ensure``."""

    root: Path

    @property
    def owner_lock(self) -> Path:
        return self.root / "owner.lock"

    @property
    def base(self) -> Path:
        return self.root / f"v{LAYOUT_VERSION}"

    @property
    def db(self) -> Path:
        return self.base / "index.sqlite3"

    @property
    def blobs(self) -> Path:
        return self.base / "blobs" / "sha256"

    @property
    def trees(self) -> Path:
        return self.base / "trees"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    @property
    def ingest(self) -> Path:
        return self.tmp / "ingest"

    @property
    def staging(self) -> Path:
        return self.tmp / "staging"

    @property
    def trash(self) -> Path:
        return self.tmp / "trash"

    @property
    def quarantine(self) -> Path:
        return self.base / "quarantine"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def published_index(self) -> Path:
        return self.root / "index" / "v1"

    @property
    def cachedir_tag(self) -> Path:
        """`CACHEDIR.TAG` (bford.info/cachedir): backup tools skip a user-mode store."""
        return self.root / "CACHEDIR.TAG"

    def blob_path(self, sha256_hex: str) -> Path:
        return self.blobs / sha256_hex[:2] / sha256_hex

    def tree_path(self, tree_hex: str) -> Path:
        return self.trees / tree_hex

    def tree_relpath(self, tree_hex: str) -> str:
        """The tree path relative to the root, as published in the published index."""
        return f"v{LAYOUT_VERSION}/trees/{tree_hex}"

    def lock_path(self, tree_hex: str) -> Path:
        return self.locks / f"{tree_hex}.lock"

    def lock_relpath(self, tree_hex: str) -> str:
        return f"locks/{tree_hex}.lock"

    def partial_path(self, algorithm: str, hex_digest: str) -> Path:
        return self.ingest / f"{algorithm}-{hex_digest}.part"

    def repo_index_path(self, repo: str) -> Path:
        org, name = repo.split("/", 1)
        return self.published_index / org / f"{name}.json"

    def ensure(self) -> None:
        """Create the directory skeleton (idempotent) with the documented modes."""
        for path, mode in (
            (self.root, DIR_MODE_PUBLIC),
            (self.base, DIR_MODE_PUBLIC),
            (self.base / "blobs", DIR_MODE_PUBLIC),
            (self.blobs, DIR_MODE_PUBLIC),
            (self.trees, DIR_MODE_PUBLIC),
            (self.tmp, DIR_MODE_PRIVATE),
            (self.ingest, DIR_MODE_PRIVATE),
            (self.staging, DIR_MODE_PRIVATE),
            (self.trash, DIR_MODE_PRIVATE),
            (self.quarantine, DIR_MODE_PRIVATE),
            (self.locks, DIR_MODE_PUBLIC),
            (self.root / "index", DIR_MODE_PUBLIC),
            (self.published_index, DIR_MODE_PUBLIC),
        ):
            try:
                path.mkdir(mode=mode)
            except FileExistsError:
                pass
            else:
                os.chmod(path, mode)  # mkdir's mode is filtered by the umask
                fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a directory so that entries created or renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_cachedir_tag(tag: Path) -> None:
    """Write `CACHEDIR.TAG` (once): a user-mode store under ~/.cache is a cache that backups
    should skip, everything in it can be fetched again."""
    if tag.exists():
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


def user_name(uid: int) -> str:
    """The account name of ``uid`` (or the number, for an id without an account)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def rerun_as(user: str) -> str:
    """The exact command line of this process, run as ``user`` (for hints)."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if prog in ("kerneldctl", "kerneld"):
        command = shlex.join([prog, *sys.argv[1:]])
    else:
        command = "<the same command>"
    return f"runuser -u {user} -- {command}"


def check_parents(root: Path) -> None:
    """Refuse a store below a directory that others may write without the sticky bit: anyone
    could rename the store away and put their own in its place."""
    for parent in root.parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue  # created later by the open, with our umask
        except OSError as exc:
            raise StoreOwnershipError(
                f"cannot open the store: stat of {parent} failed: {exc.strerror}; make the "
                "directories above the store traversable by its owner",
                path=str(root),
            ) from None
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise StoreOwnershipError(
                f"refusing the store at {root}: {parent} (mode {st.st_mode & 0o7777:04o}) is "
                "writable by every user without the sticky bit, so anyone could replace the "
                f"store; run `chmod o-w {parent}` (or `chmod +t`), or put the store elsewhere",
                path=str(root),
            )


def check_root(root: Path, *, euid: int | None = None) -> int:
    """The uid that owns the store at ``root``, checked for a read-write open by ``euid``.

    The store must be owned by the opening process. Root is no exception: files it created
    in a store owned by ``kerneld`` would be root's, which the daemon can then neither use nor
    remove, so it is told to run the command as the owner instead. A missing root is created by
    the open; root may not create one inside a directory another user owns (``/var/lib/kerneld``
    belongs to ``kerneld``), for the same reason.
    """
    euid = os.geteuid() if euid is None else euid
    real = Path(os.path.realpath(root))
    check_parents(real)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        parent = next((p for p in real.parents if os.path.lexists(p)), Path("/"))
        owner = os.stat(parent).st_uid
        if euid == 0 and owner != 0:
            name = user_name(owner)
            raise StoreOwnershipError(
                f"refusing to create the store {root} as root inside {parent}, which belongs "
                f"to {name}: the daemon running as {name} could not use root's files; run the "
                f"command as that user: `{rerun_as(name)}`",
                path=str(root),
            ) from None
        return euid
    except OSError as exc:
        raise StoreOwnershipError(
            f"cannot open the store: stat of {root} failed: {exc.strerror}; make the "
            "directories above it traversable by the store's owner",
            path=str(root),
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StoreOwnershipError(f"{root} is not a directory", path=str(root))
    if st.st_uid == euid:
        return euid
    owner_name, me = user_name(st.st_uid), user_name(euid)
    if euid == 0:
        raise StoreOwnershipError(
            f"the store {root} belongs to {owner_name}; root does not change it (its files "
            f"would be root's, unusable by the daemon); run the command as the owner: "
            f"`{rerun_as(owner_name)}`",
            path=str(root),
        )
    raise StoreOwnershipError(
        f"the store {root} is owned by {owner_name} (uid {st.st_uid}), not by {me} (uid "
        f"{euid}) that opens it: a store must belong to the user of its daemon; if it is meant "
        f"to be {me}'s, run `chown -R {me}: {root}` as root, otherwise give this daemon its "
        "own store path",
        path=str(root),
    )
