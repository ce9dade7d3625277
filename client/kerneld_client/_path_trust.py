"""Trust checks on a kernel folder before it is imported.

Importing a kernel runs its code (and dlopens its native library) in the training process, so a
folder is imported only if nobody but the store owner could have put anything in it: it must lie
inside the store root, every directory from the root down and every file in it must be owned by
the store owner (the uid that owns the root) and not be writable by group or others, and no
symlink may lead out of the tree. The daemon verified every byte when it published the tree;
these checks make sure what is there now is still what it published.

Whose store it is matters as much: the owner of the root is trusted only if it is root, this
process's own user (user mode) or the daemon's user (`kerneld`, or $KERNELD_STORE_OWNER), and no
directory above the root may be writable by anyone else, unless it is sticky (like /tmp) and the
entry below it belongs to a trusted user. Otherwise whoever could create or rename the root (a
pre-created store in /tmp) would decide what is imported. The daemon's advert gets the same
rule (`check_advert`): it names the store, so a planted one would be as good as a planted store.

A few `lstat` calls for a typical tree (tens of microseconds): cheap enough for every load.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kerneld_client import _config
from kerneld_client.errors import UntrustedPath

__all__ = [
    "StoreRoot",
    "check_advert",
    "check_ancestors",
    "check_real_tree",
    "check_tree",
    "store_root",
    "trusted_uids",
]

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_FIX_OWNER = (
    "a store, its index and the daemon's advert must belong to root, to you or to the daemon's "
    "user (the system user kerneld, or the user named by KERNELD_STORE_OWNER); if the daemon "
    "really runs as that user set KERNELD_STORE_OWNER, otherwise someone else created the path: "
    "remove it and let the daemon create it"
)
_FIX_PARENT = (
    "keep the store and the daemon's sockets in a directory only root or the daemon's user can "
    "write (the defaults /var/lib/kerneld and /run/kerneld, or your own home), or make the "
    "world-writable directory sticky and the entry in it owned by root or the daemon's user"
)


class TrustedUids:
    """Who may own a store root or an advert: root, this process's user, the daemon's user.

    The daemon's user is looked up only for a uid that is neither of the others: the passwd
    lookup (0.12 ms) cost more than the rest of a user-mode warm load's trust checks."""

    __slots__ = ("_me",)

    def __init__(self) -> None:
        self._me = os.geteuid()

    def __contains__(self, uid: object) -> bool:
        return uid in (0, self._me) or (uid is not None and uid == _config.store_owner_uid())

    def __str__(self) -> str:
        owner = _config.store_owner_uid()
        uids = {0, self._me} if owner is None else {0, self._me, owner}
        return "uid " + ", ".join(str(u) for u in sorted(uids))


def trusted_uids() -> TrustedUids:
    return TrustedUids()


def check_ancestors(real: str, child_uid: int, what: str, trusted: TrustedUids) -> None:
    """Every directory above `real` (a resolved path, up to /): owned by a trusted uid, and not
    writable by group or others unless it is sticky and the entry below it is trusted-owned.

    A directory someone else can write lets them rename the entry below it away and put their
    own in its place; the sticky bit forbids that only for entries they do not own.
    """
    child = real
    while True:
        parent = os.path.dirname(child)
        if parent == child:
            return
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedPath(f"{what}: {parent} is not a directory", hint=_FIX_PARENT)
        if st.st_uid not in trusted:
            raise UntrustedPath(
                f"{what}: the directory {parent} above it is owned by uid {st.st_uid}, not by "
                f"a trusted user ({trusted}), who could replace it",
                hint=_FIX_PARENT,
            )
        if st.st_mode & _WRITABLE_BY_OTHERS and not (
            st.st_mode & stat.S_ISVTX and child_uid in trusted
        ):
            if st.st_mode & stat.S_ISVTX:
                detail = f"sticky, but the entry in it belongs to uid {child_uid}"
            else:
                detail = "not sticky"
            raise UntrustedPath(
                f"{what}: the directory {parent} above it is writable by group or others "
                f"(mode {st.st_mode & 0o7777:o}, {detail}), so another user could replace it",
                hint=_FIX_PARENT,
            )
        child = parent
        child_uid = st.st_uid


def check_advert(path: Path) -> tuple[int, os.stat_result] | None:
    """Open the daemon's advert for reading if it can be trusted: a regular file owned by a
    trusted uid, not writable by group or others, in a directory chain that passes
    `check_ancestors`. Returns (fd, stat) or None when there is no advert; UntrustedPath else."""
    real = os.path.join(os.path.realpath(path.parent), path.name)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(real):
            raise UntrustedPath(
                f"the daemon's advert {path} is a symlink; kerneld never writes one",
                hint=_FIX_OWNER,
            ) from exc
        # Absent, or not readable by this user: no advert can mislead us (the defaults apply).
        return None
    try:
        st = os.fstat(fd)
        trusted = trusted_uids()
        what = f"the daemon's advert {path}"
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(f"{what} is not a regular file", hint=_FIX_OWNER)
        if st.st_uid not in trusted:
            raise UntrustedPath(
                f"{what} is owned by uid {st.st_uid}, not by a trusted user ({trusted})",
                hint=_FIX_OWNER,
            )
        if st.st_mode & _WRITABLE_BY_OTHERS:
            raise UntrustedPath(
                f"{what} is writable by group or others (mode {st.st_mode & 0o7777:o})",
                hint=_FIX_OWNER,
            )
        check_ancestors(real, st.st_uid, what, trusted)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


class StoreRoot:
    """A store root, resolved once: its real path (`real`, and as a Path: every file of the
    store is found from it, and a Path costs microseconds to make), its owner's uid, and the
    identity of the directory that was checked (`unchanged`)."""

    __slots__ = ("checked", "owner_uid", "path", "real", "real_path")

    def __init__(self, path: Path, real: str, owner_uid: int, checked: tuple[int, ...]) -> None:
        self.path = path
        self.real = real
        self.real_path = Path(real)
        self.owner_uid = owner_uid
        self.checked = checked

    def unchanged(self) -> bool:
        """Is the root still the directory that was checked, with the same owner and mode? (Its
        change time moves with any chmod, chown or entry added or removed; a replaced directory
        is another inode.) One `lstat`."""
        try:
            return _identity(os.lstat(self.real)) == self.checked
        except OSError:
            return False


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def store_root(path: Path) -> StoreRoot:
    """Resolve a store root and check who owns it and who can replace it (the owner becomes the
    owner every tree must have); FileNotFoundError if there is none."""
    real = os.path.realpath(path)
    st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(f"store root {path} is not a directory")
    trusted = trusted_uids()
    if st.st_uid not in trusted:
        raise UntrustedPath(
            f"store root {path} is owned by uid {st.st_uid}, not by a trusted user "
            f"({trusted}: root, you, the daemon's user)",
            hint=_FIX_OWNER,
        )
    if st.st_mode & _WRITABLE_BY_OTHERS:
        raise UntrustedPath(
            f"store root {path} is writable by group or others (mode {st.st_mode & 0o7777:o})",
            hint="chmod go-w it; only the daemon may write its store",
        )
    check_ancestors(real, st.st_uid, f"store root {path}", trusted)
    return StoreRoot(path, real, st.st_uid, _identity(st))


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
    candidate = tree if tree.is_absolute() else root.real_path / tree
    return check_real_tree(root, os.path.realpath(candidate), tree)


def check_real_tree(root: StoreRoot, real: str, tree: Path | str | None = None) -> Path:
    """`check_tree` of a path the caller already resolved (`tree`: as the caller named it,
    for the errors). Walking down from the root with `lstat` and finding a directory at every
    step also proves that nothing on the way became a symlink since it was resolved."""
    if not _inside(real, root.real) or real == root.real:
        raise UntrustedPath(f"{tree or real} is outside the store root {root.path}")
    # Every directory from the root down to the tree: a writable one could swap the tree.
    current = root.real
    for part in real[len(root.real.rstrip("/")) + 1 :].split("/"):
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
