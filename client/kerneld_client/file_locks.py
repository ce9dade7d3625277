"""File locks, both kinds kerneld uses, in one place for the daemon and the client.

`flock`: the daemon's private lock files (one daemon per socket and per store, one writer per
partial download) and the client's per-user coalescing locks. A `flock` needs only a
read-only descriptor, so these files are private to their owner (0600).

OFD locks (`F_OFD_SETLK`): the per-tree lock files any user may open. A job holds the OFD read
lock while it uses a tree; GC probes with the OFD write lock, which needs a descriptor open for
writing, so only the store's owner can ever keep readers out.

Standard library only: the warm path takes a tree's read lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from kerneld_client._loads import OFD_READ, OFD_WRITE, TreeGone, lock_shared, ofd_lock

__all__ = [
    "OFD_READ",
    "OFD_WRITE",
    "PID_LOCK_MODE",
    "PidLock",
    "PidLockHeld",
    "TreeGone",
    "lock_shared",
    "ofd_lock",
    "pid_lock_held",
    "read_lock_pid",
    "release_flock",
    "try_flock",
]


def try_flock(fd: int, *, shared: bool = False) -> bool:
    """Take a `flock` on `fd` without waiting: False when another descriptor holds one that
    conflicts (an exclusive one, or any for an exclusive request)."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def release_flock(fd: int) -> None:
    """Drop this descriptor's `flock` (closing the last descriptor of the file drops it too)."""
    fcntl.flock(fd, fcntl.LOCK_UN)


# The tree lock (`lock_shared`, what GC probes it with, and TreeGone) is defined in `_loads`,
# shared with the warm fast path, which takes it on every warm load: one implementation for both.
#
# `lock_shared(lock_path, tree_path, *, blocking=False)` takes the OFD read lock on a tree's lock
# file and returns the fd that holds it. While the fd stays open, GC keeps the tree. GC unlinks a
# lock file while holding the OFD write lock (which needs a writable descriptor: only the daemon
# has one), so after our lock succeeds the path must still name the inode we locked, and the tree
# must still exist; otherwise TreeGone. BlockingIOError (non-blocking) means GC is deleting it
# right now; FileNotFoundError: there is no lock file. `ofd_lock` takes an open-file-description
# lock: unlike `flock`, a write lock needs a descriptor open for writing, so only the owner of a
# lock file can ever keep readers out; unlike classic `fcntl` locks it belongs to the descriptor.
# `OFD_READ`/`OFD_WRITE` are ``struct flock`` (``hhqqi`` + padding) built without `struct` (tests
# check they equal ``struct.pack("hhqqi4x", type, SEEK_SET, 0, 0, 0)``).


#: A pid lock file is private: `flock` needs only a read-only descriptor, so one other users
#: could open would let any of them hold it and keep the daemon from (re)starting.
PID_LOCK_MODE = 0o600


class PidLockHeld(Exception):
    """Another live process holds the pid lock; `pid` is what it wrote (None if unreadable)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid if pid is not None else 'unknown'}")
        self.path = path
        self.pid = pid


class PidLock:
    """An exclusive `flock` on a private file that holds the owner's pid: one daemon per socket
    path, one owner per store. The lock dies with its process, so a crash never leaves it
    stale; the pid is only there to name the holder in the error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PID_LOCK_MODE)
        if not try_flock(fd):
            pid = read_lock_pid(fd)
            os.close(fd)
            raise PidLockHeld(path, pid)
        os.fchmod(fd, PID_LOCK_MODE)  # lock files made before they became private
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_lock_pid(fd: int) -> int | None:
    """The pid a `PidLock` holder wrote into its file, or None."""
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def pid_lock_held(path: Path) -> bool:
    """True if some process holds the `PidLock` at `path` (a shared probe: it never takes the
    lock from, or blocks, the holder)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return not try_flock(fd, shared=True)
    finally:
        os.close(fd)
