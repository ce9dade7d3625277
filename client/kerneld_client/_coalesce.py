"""One cold resolve per kernel per user per host: the other processes wait and read the index.

When the ranks of a job start together on a host whose store lacks a kernel, each would import
grpc and ask the daemon (~80 ms of CPU per rank: on a small host 64 ranks queue for the cores).
The daemon already downloads once; this makes the *asking* happen once too. The first process to
miss takes an exclusive `flock` on a per-(daemon, kernel request) lock file and asks; the others
find it taken, wait until it is released (a released or dead holder frees it: flocks die with
their process), then read the published index, which now answers without any RPC. A waiter
whose index still misses (another platform, a failed fetch) asks the daemon itself, without
taking the lock again, so a failure never serialises the ranks.

The lock files live in `$TMPDIR/kerneld-<uid>/resolving/` (node-local, unlike a home directory
on NFS), in a directory that must belong to this user and be closed to others: no other user can
open, let alone lock, them. Another user can create that name in a shared `/tmp` first; then
`$XDG_RUNTIME_DIR/kerneld/resolving/` (the user's own tmpfs) is used instead. When neither is
safe, or with `KERNELD_COALESCE=0`, coalescing is off: every process asks, which is correct and
only slower, so a squatter can cost a cold start some CPU but never a kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kerneld_client import _config
from kerneld_client._types import KernelRequest
from kerneld_client.file_locks import release_flock, try_flock
from kerneld_client.locations import default_socket, private_dir, private_tmp_dir, runtime_dir
from kerneld_client.vocabulary import is_repo_id

#: `0`/`off`/`no`/`false` disables coalescing of cold resolves between processes.
_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.025


#: (key, thread) -> the lock file of a turn the warm path's miss took in that thread, handed to
#: the staged loader's turn for the same request in the same thread (another thread waits as
#: another process would).
_HELD: dict[tuple[str, int], int] = {}


def _lock_dir() -> Path | None:
    """This user's private lock directory, created if needed; None if none is safe."""
    folder = private_tmp_dir("resolving")
    runtime = runtime_dir()
    if folder is None and runtime:
        uid = os.geteuid()
        base = runtime / "kerneld"
        # Check each level before creating the next: nothing is made inside someone else's dir.
        if private_dir(base, uid) and private_dir(base / "resolving", uid):
            folder = base / "resolving"
    return folder


def _key(socket: Path, req: KernelRequest) -> str:
    raw = "\0".join((str(socket), req.repo_id, req.ref, str(req.version)))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@contextlib.contextmanager
def turn(
    socket: Path, req: KernelRequest, deadline_s: float, *, hand_over: bool = False
) -> Iterator[bool]:
    """Yield True when this process should ask the daemon (holding the lock meanwhile), False
    when another process just did and the index should be read first.

    Waits at most `deadline_s` for the other process; never raises for lock trouble (it
    yields True: asking is always correct, only slower). With `hand_over` a lock taken is left
    to the same thread's next `turn` for the request, which releases it when the daemon has
    answered (`warm_turn`).
    """
    key = _key(socket, req)
    mine = (key, threading.get_ident())
    handed = _HELD.pop(mine, None)
    if handed is not None:  # this thread took the turn in the warm path's miss: ask now
        try:
            yield True
        finally:
            os.close(handed)  # releases the lock
        return
    if not _config.coalescing():
        yield True
        return
    folder = _lock_dir()
    if folder is None:
        yield True
        return
    try:
        fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield True
        return
    try:
        try:
            taken = try_flock(fd)
        except OSError:
            yield True
            return
        if not taken:
            _wait_free(fd, deadline_s)
            yield False
            return
        if hand_over:
            _HELD[mine], fd = fd, -1
        yield True  # the lock is held until the daemon has answered
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock, if held


@contextlib.contextmanager
def warm_turn(repo_id: object, version: object, revision: object) -> Iterator[bool]:
    """`turn` for the warm path's miss, taken there rather than in the staged loader, so the
    waiting ranks never import that loader: at N = 64 on 2 cores those imports (~30 ms of CPU
    each) were most of what a cold start cost over a warm one. The lock is held, as before,
    only until the daemon has answered (the staged loader's own turn releases it), or until
    the staged loader returned without asking. A request the warm path cannot name, or a host
    without the daemon's socket, yields True at once: nothing to wait for."""
    if (
        not is_repo_id(repo_id)
        or (version is None) == (revision is None)
        or (version is not None and (type(version) is not int or version < 0))
        or (revision is not None and type(revision) is not str)
    ):
        yield True
        return
    assert isinstance(repo_id, str)
    socket = default_socket()
    if not os.path.exists(socket):
        yield True
        return
    request = KernelRequest(repo_id, version=version, revision=revision)
    mine = (_key(socket, request), threading.get_ident())
    with turn(socket, request, _config.fetch_timeout_s(), hand_over=True) as ask:
        try:
            yield ask
        finally:
            left = _HELD.pop(mine, None)
            if left is not None:  # the staged loader did not ask the daemon
                os.close(left)


def _wait_free(fd: int, deadline_s: float) -> None:
    """Poll until the holder releases the lock (or dies), or the deadline passes."""
    end = time.monotonic() + deadline_s
    delay = _FIRST_POLL_S
    while time.monotonic() < end:
        time.sleep(delay)
        try:
            taken = try_flock(fd)
        except OSError:
            return
        if not taken:
            delay = min(delay * 2, _MAX_POLL_S)
            continue
        release_flock(fd)
        return
