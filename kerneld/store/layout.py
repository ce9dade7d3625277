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
    ├── locks/<64 hex>.lock              0444  one per published tree; clients hold LOCK_SH
    └── index/v1/                        0755  the read-only client index (see client_index.py)
        ├── denies.json
        └── <org>/<name>.json

Nothing here is trusted by existence alone: a blob or tree is valid only while the index has a
``live`` row for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LAYOUT_VERSION = 1

DIR_MODE_PUBLIC = 0o755
DIR_MODE_PRIVATE = 0o700
DIR_MODE_TREE = 0o555
FILE_MODE_BLOB = 0o444
FILE_MODE_EXEC = 0o555
FILE_MODE_LOCK = 0o444
FILE_MODE_PUBLIC = 0o644
FILE_MODE_DB = 0o600


def is_hex(value: str, length: int) -> bool:
    return len(value) == length and all(c in "0123456789abcdef" for c in value)


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
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def client_index(self) -> Path:
        return self.root / "index" / "v1"

    def blob_path(self, sha256_hex: str) -> Path:
        return self.blobs / sha256_hex[:2] / sha256_hex

    def tree_path(self, tree_hex: str) -> Path:
        return self.trees / tree_hex

    def tree_relpath(self, tree_hex: str) -> str:
        """The tree path relative to the root, as published in the client index."""
        return f"v{LAYOUT_VERSION}/trees/{tree_hex}"

    def lock_path(self, tree_hex: str) -> Path:
        return self.locks / f"{tree_hex}.lock"

    def lock_relpath(self, tree_hex: str) -> str:
        return f"locks/{tree_hex}.lock"

    def partial_path(self, algorithm: str, hex_digest: str) -> Path:
        return self.ingest / f"{algorithm}-{hex_digest}.part"

    def repo_index_path(self, repo: str) -> Path:
        org, name = repo.split("/", 1)
        return self.client_index / org / f"{name}.json"

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
            (self.locks, DIR_MODE_PUBLIC),
            (self.root / "index", DIR_MODE_PUBLIC),
            (self.client_index, DIR_MODE_PUBLIC),
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
