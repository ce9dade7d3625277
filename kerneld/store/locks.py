"""Liveness locks: the store's owner lock and the per-tree lock files clients hold.

Per-tree protocol. Each published tree has ``<root>/locks/<hex>.lock`` (mode 0644: any user can
open it read-only, only the store owner for writing). A client holds an open-file-description
(OFD) *read* lock on it for as long as it uses the tree. GC probes with the OFD *write* lock,
non-blocking: if that fails the tree is in use and is kept. When GC does delete a tree it keeps
the write lock while it unlinks the lock file and moves the tree away, so a client that raced it
sees, after its own read lock succeeds, that the lock path no longer names the inode it locked
(see :func:`hold_tree_lock`).

Why OFD locks and not ``flock``: ``flock(LOCK_EX)`` needs only a read-only descriptor, so any
user who can open the file could hold it and make every job fall back for that kernel. An OFD
write lock needs a descriptor open for writing, which only the owner (the daemon) can get; what
another user can take (``flock`` of either kind, OFD or classic read locks) never keeps a job
from its read lock. At worst they keep a tree alive, exactly as a job that uses it does.

Why not `filelock`: it takes exclusive locks on files it may create and write, where these are
shared and exclusive OFD locks on files most users may only read; the owner lock and the tree
locks are a few `fcntl` calls here.

Compatibility: clients before OFD locks hold ``flock(LOCK_SH)``. GC also probes and holds
``flock(LOCK_EX)`` so it never deletes a tree such a client uses (a ``flock`` another user holds
keeps a tree alive, which a read lock allows anyway); those old clients still fall back while a
user holds ``LOCK_EX`` on the file, as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kerneld_client.file_locks import (
    OFD_WRITE,
    PidLock,
    PidLockHeld,
    TreeGone,
    lock_shared,
    ofd_lock,
    pid_lock_held,
    try_flock,
)

from .errors import StoreLockedError
from .layout import FILE_MODE_LOCK

# TreeGone is part of this module's interface (GC and tests catch it from here).
__all__ = [
    "OwnerLock",
    "Probe",
    "TreeGone",
    "create_tree_lock",
    "hold_tree_lock",
    "is_held",
    "owner_is_running",
    "try_lock_exclusive",
]


class OwnerLock:
    """The exclusive lock that makes one process the owner of a store (a `PidLock`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._lock = PidLock(path)
        except PidLockHeld as exc:
            raise StoreLockedError(str(path.parent), exc.pid) from None

    def release(self) -> None:
        self._lock.release()


def owner_is_running(path: Path) -> bool:
    """True if some process holds the owner lock (a live daemon)."""
    return pid_lock_held(path)


def create_tree_lock(path: Path) -> None:
    """Create a tree's lock file (mode 0644: only the owner may write it) if it does not exist."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE_LOCK)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE_LOCK)
    finally:
        os.close(fd)


@dataclass
class Probe:
    """Result of probing a tree lock: ``held`` by someone, or free (``fd`` holds the OFD write
    lock and ``flock(LOCK_EX)``; None when there is no lock file at all)."""

    held: bool
    fd: int | None = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_for_write(path: Path) -> int:
    """Open a tree lock file read-write; lock files made before OFD locks are 0444 and are made
    0644 here (the owner may chmod them; that is the only way to get a writable descriptor)."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        return os.open(path, flags)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise
            os.fchmod(fd, FILE_MODE_LOCK)
        finally:
            os.close(fd)
        return os.open(path, flags)


def try_lock_exclusive(path: Path) -> Probe:
    """Probe a tree lock for GC with the OFD write lock and ``flock(LOCK_EX)`` (clients older than
    OFD locks), both non-blocking; the caller releases the probe."""
    try:
        fd = _open_for_write(path)
    except FileNotFoundError:
        return Probe(held=False)
    try:
        ofd_lock(fd, OFD_WRITE, blocking=False)
        free = try_flock(fd)
    except BlockingIOError:
        free = False
    except BaseException:
        os.close(fd)
        raise
    if not free:
        os.close(fd)
        return Probe(held=True)
    return Probe(held=False, fd=fd)


def is_held(path: Path) -> bool:
    """True if some process holds a lock on this tree lock file."""
    probe = try_lock_exclusive(path)
    probe.release()
    return probe.held


@contextlib.contextmanager
def hold_tree_lock(lock_path: Path, tree_path: Path, *, blocking: bool = False) -> Iterator[int]:
    """Hold the OFD read lock on a tree for the duration of the block (the client protocol, whose
    one implementation is ``kerneld_client.file_locks.lock_shared``).

    Raises :class:`TreeGone` if GC removed the tree meanwhile, ``BlockingIOError`` if
    non-blocking and GC is deleting it right now.
    """
    fd = lock_shared(lock_path, tree_path, blocking=blocking)
    try:
        yield fd
    finally:
        os.close(fd)
