"""Trust checks on a kernel folder before it is imported.

Importing a kernel runs its code (and dlopens its native library) in the training process, so a
folder is imported only if nobody but the store owner could have put anything in it: it must lie
inside the store root, every directory from the root down and every file in it must be owned by
the store owner (the uid that owns the root) and not be writable by group or others, and no
symlink may lead out of the tree. The daemon verified every byte when it published the tree;
these checks make sure what is there now is still what it published.

A few `lstat` calls for a typical tree (tens of microseconds): cheap enough for every load.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kerneld_client.errors import UntrustedPath

__all__ = ["StoreRoot", "check_tree", "store_root"]

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class StoreRoot:
    """A store root, resolved once: its real path and the uid of its owner."""

    __slots__ = ("owner_uid", "path", "real")

    def __init__(self, path: Path, real: str, owner_uid: int) -> None:
        self.path = path
        self.real = real
        self.owner_uid = owner_uid


def store_root(path: Path) -> StoreRoot:
    """Resolve a store root and check it; FileNotFoundError if there is none."""
    real = os.path.realpath(path)
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(f"store root {path} is not a directory")
    if st.st_mode & _WRITABLE_BY_OTHERS:
        raise UntrustedPath(
            f"store root {path} is writable by group or others (mode {st.st_mode & 0o7777:o})"
        )
    return StoreRoot(path, real, st.st_uid)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_entry(path: str, st: os.stat_result, owner_uid: int, what: str) -> None:
    if st.st_uid != owner_uid:
        raise UntrustedPath(
            f"{what} {path} is owned by uid {st.st_uid}, not by the store owner (uid {owner_uid})"
        )
    if st.st_mode & _WRITABLE_BY_OTHERS:
        raise UntrustedPath(
            f"{what} {path} is writable by group or others (mode {st.st_mode & 0o7777:o})"
        )


def check_tree(root: StoreRoot, tree: Path) -> Path:
    """Check `tree` (absolute, or relative to the root) and return its real path.

    Raises UntrustedPath naming the first offending path.
    """
    candidate = tree if tree.is_absolute() else Path(root.real) / tree
    real = os.path.realpath(candidate)
    if not _inside(real, root.real) or real == root.real:
        raise UntrustedPath(f"{tree} is outside the store root {root.path}")
    # Every directory from the root down to the tree: a writable one could swap the tree.
    rel_parts = Path(real).relative_to(root.real).parts
    current = root.real
    for part in rel_parts:
        current = os.path.join(current, part)
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedPath(f"{current} is not a directory")
        _check_entry(current, st, root.owner_uid, "directory")
    _check_contents(real, root.owner_uid)
    return Path(real)


def _check_contents(tree: str, owner_uid: int) -> None:
    """Every entry below `tree`: owned, not writable by others, regular files and directories,
    symlinks only if they stay inside the tree."""
    stack = [tree]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(entry.path)
                    if not _inside(target, tree):
                        raise UntrustedPath(f"{entry.path} is a symlink out of the tree ({target})")
                    _check_entry(entry.path, st, owner_uid, "symlink")
                    continue  # the target is checked where it lies, inside the tree
                if stat.S_ISDIR(st.st_mode):
                    _check_entry(entry.path, st, owner_uid, "directory")
                    stack.append(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    _check_entry(entry.path, st, owner_uid, "file")
                else:
                    raise UntrustedPath(f"{entry.path} is neither a file nor a directory")
