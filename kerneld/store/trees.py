"""Materialise a variant tree from blobs in a private staging directory.

Files are hard links to their blobs (same inode, mode 0444); a file is copied instead when it
must be executable (0555) or when the file system refuses the link (``EXDEV``, ``EMLINK``,
``EPERM``, ``ENOTSUP``). A copy is hashed while it is written, so a blob that rotted on disk is
not copied into a tree. Directories below the top end up 0555; the top stays 0700 until it is in
place: ``rename(2)`` of a directory rewrites its ``..`` entry, which needs write permission on
the directory itself, so a daemon that is not root (no CAP_DAC_OVERRIDE) could not move a 0555
tree. Publishing (rename into ``trees/``, then `seal_top`) and the index commit are the Store's
job.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from . import faults
from .errors import BlobMissingError, DigestMismatchError, ResourceExhaustedError
from .layout import DIR_MODE_TREE, FILE_MODE_BLOB, Layout, fsync_dir
from .manifest import ManifestEntry

log = logging.getLogger("kerneld.store.trees")

_LINK_FALLBACK = {errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP}
_NOSPACE = {errno.ENOSPC, errno.EDQUOT}
COPY_CHUNK = 1 << 20


def build_staging(
    layout: Layout,
    entries: Sequence[ManifestEntry],
    *,
    reserve: Callable[[int], None],
    use_hardlinks: bool = True,
    ctx: dict[str, str | None] | None = None,
) -> tuple[Path, int]:
    """Build the tree in a new staging directory; return (its path, bytes copied)."""
    context = dict(ctx or {})
    staging = layout.staging / os.urandom(8).hex()
    staging.mkdir(mode=0o700)
    copied = 0
    made_dirs: list[Path] = [staging]
    try:
        for entry in entries:
            dst = staging / entry.path
            parent = dst.parent
            if parent != staging and not parent.is_dir():
                missing_dirs = []
                p = parent
                while p != staging and not p.is_dir():
                    missing_dirs.append(p)
                    p = p.parent
                for d in reversed(missing_dirs):
                    d.mkdir(mode=0o700)
                    made_dirs.append(d)
            src = layout.blob_path(entry.sha256)
            linked = False
            if use_hardlinks and entry.mode == FILE_MODE_BLOB:
                try:
                    os.link(src, dst, follow_symlinks=False)
                    linked = True
                except FileNotFoundError:
                    raise BlobMissingError([entry.sha256], path=entry.path, **context) from None
                except OSError as exc:
                    if exc.errno not in _LINK_FALLBACK:
                        raise
            if not linked:
                reserve(entry.size)
                _copy_verified(src, dst, entry, context)
                copied += entry.size
            faults.point("tree.file")
        for d in sorted(made_dirs, key=lambda p: len(p.parts), reverse=True):
            if d != staging:  # the top is sealed after the rename (module docstring)
                os.chmod(d, DIR_MODE_TREE)
            fsync_dir(d)
    except OSError as exc:
        remove_tree(staging)
        if exc.errno in _NOSPACE:
            raise ResourceExhaustedError(
                sum(e.size for e in entries), 0, "file system's free space", **context
            ) from exc
        raise
    except BaseException:
        remove_tree(staging)
        raise
    return staging, copied


def _copy_verified(src: Path, dst: Path, entry: ManifestEntry, ctx: dict[str, str | None]) -> None:
    try:
        sfd = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise BlobMissingError([entry.sha256], path=entry.path, **ctx) from None
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            h = hashlib.sha256()
            while True:
                chunk = os.read(sfd, COPY_CHUNK)
                if not chunk:
                    break
                h.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dfd, view) :]
            if h.hexdigest() != entry.sha256:
                raise DigestMismatchError(
                    "sha256 (stored blob)",
                    entry.sha256,
                    h.hexdigest(),
                    path=entry.path,
                    **ctx,
                )
            os.fsync(dfd)
            os.fchmod(dfd, entry.mode)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def seal_top(tree: Path) -> None:
    """Make a tree's top directory read-only, once it has been renamed into place."""
    os.chmod(tree, DIR_MODE_TREE)


def unseal_top(tree: Path) -> None:
    """Make a tree's top directory writable by its owner, so it can be renamed (to the trash)."""
    if not tree.is_symlink() and tree.is_dir():
        os.chmod(tree, 0o700)


def remove_tree(path: Path) -> None:
    """Delete a (possibly read-only) directory tree; missing is fine."""
    if not os.path.lexists(path):
        return
    if not path.is_dir() or path.is_symlink():
        path.unlink()
        return
    for dirpath, dirnames, _files in os.walk(path):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            full = os.path.join(dirpath, d)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)
