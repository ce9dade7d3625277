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

import errno
import fcntl
import os
import sys
from pathlib import Path


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


class TreeGone(Exception):
    """The tree was deleted between finding it and locking it: treat as a miss."""


#: ``struct flock`` (``hhqqi`` + 4 bytes of padding on 64-bit Linux) for a whole-file lock of the
#: given type, built without the ``struct`` module (not otherwise imported on the warm path;
#: tests check these equal ``struct.pack("hhqqi4x", type, SEEK_SET, 0, 0, 0)``). OFD locks
#: require ``l_pid == 0``.
_FLOCK_SIZE = 32
OFD_READ = fcntl.F_RDLCK.to_bytes(2, sys.byteorder) + bytes(_FLOCK_SIZE - 2)
OFD_WRITE = fcntl.F_WRLCK.to_bytes(2, sys.byteorder) + bytes(_FLOCK_SIZE - 2)
#: What F_OFD_SETLK fails with when a conflicting lock is held (POSIX allows either).
_CONFLICT = (errno.EAGAIN, errno.EACCES)


def ofd_lock(fd: int, kind: bytes, *, blocking: bool) -> None:
    """Take an open-file-description lock on the whole file (`OFD_READ` or `OFD_WRITE`).

    Unlike `flock`, a write lock needs a descriptor open for writing (EBADF otherwise), so on a
    lock file only its owner can write, no one else can ever hold the lock that keeps readers
    out. Unlike classic `fcntl` locks, it belongs to the descriptor (closing another descriptor of
    the file does not drop it) and conflicts between descriptors of one process too.
    BlockingIOError when non-blocking and a conflicting lock is held.
    """
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if blocking else fcntl.F_OFD_SETLK, kind)
    except OSError as exc:
        if exc.errno in _CONFLICT and not isinstance(exc, BlockingIOError):
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)) from exc
        raise


def lock_shared(lock_path: Path, tree_path: Path, *, blocking: bool = False) -> int:
    """Take the OFD read lock on a tree's lock file and return the fd that holds it.

    While the fd stays open, GC keeps the tree. GC unlinks a lock file while holding the OFD write
    lock (which needs a writable descriptor: only the daemon has one), so after our lock succeeds
    the path must still name the inode we locked, and the tree must still exist; otherwise
    TreeGone. Non-blocking by default: BlockingIOError means GC is deleting it right now.
    FileNotFoundError: there is no lock file (no such tree). `flock` locks other users take on
    the file do not interact with this one.
    """
    fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        ofd_lock(fd, OFD_READ, blocking=blocking)
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same or not tree_path.is_dir():
            raise TreeGone(str(tree_path))
    except BaseException:
        os.close(fd)
        raise
    return fd


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
