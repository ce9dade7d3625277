"""Blob ingest: stream bytes into a partial file while hashing, then commit against a digest.

A :class:`BlobWriter` hashes every byte exactly once, as it passes through ``write``; nothing is
read back to hash it, except when a writer resumes a partial file left by an earlier process
(those bytes were never hashed by this process, so they are read once). ``offset`` tells the
caller where to continue, e.g. with an HTTP ``Range: bytes=<offset>-`` request.

The expected digest comes from the upstream: sha256 for LFS/Xet files, or the git blob sha1
(``sha1(b"blob <size>\\0" + content)``) for plain git files. Blobs are always addressed by sha256,
so with a git sha1 both digests are computed in the same pass. The size must be known up front:
it is reserved against the quota before the first byte is written, it is part of the git blob
header, and a stream that runs past it is cut off at once.

Large blobs are written by a helper thread (hashing in the caller's thread overlaps with the copy
into the page cache and with periodic ``fdatasync``), so the final ``fsync`` has little left to do.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import queue
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kerneld_client.file_locks import try_flock
from kerneld_client.vocabulary import is_hex

from . import faults
from .errors import (
    DigestMismatchError,
    IngestInProgressError,
    InvalidInputError,
    ResourceExhaustedError,
    SizeMismatchError,
    StoreError,
)
from .layout import FILE_MODE_BLOB

log = logging.getLogger("kerneld.store.blobs")

THREADED_MIN_SIZE = 8 << 20
SYNC_EVERY = 64 << 20
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Expected:
    """What the upstream promised about a file: its size and at least one digest (hex)."""

    size: int
    sha256: str | None = None
    git_sha1: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 0:
            raise InvalidInputError(f"invalid expected size {self.size!r}")
        if self.sha256 is None and self.git_sha1 is None:
            raise InvalidInputError(
                "an expected sha256 or git blob sha1 is required: the store accepts no "
                "unverified bytes"
            )
        if self.sha256 is not None and not is_hex(self.sha256, 64):
            raise InvalidInputError(f"invalid sha256 {self.sha256!r}: expected 64 hex digits")
        if self.git_sha1 is not None and not is_hex(self.git_sha1, 40):
            raise InvalidInputError(f"invalid git sha1 {self.git_sha1!r}: expected 40 hex digits")

    @property
    def key(self) -> tuple[str, str]:
        """Name of the partial file: by sha256 if known, else by git sha1."""
        if self.sha256 is not None:
            return ("sha256", self.sha256)
        assert self.git_sha1 is not None
        return ("gitsha1", self.git_sha1)


@dataclass(frozen=True)
class BlobInfo:
    sha256: str
    size: int
    git_sha1: str | None = None
    created: bool = True
    """False when the blob was already in the store (dedupe)."""


def git_blob_header(size: int) -> bytes:
    return b"blob %d\x00" % size


CommitFn = Callable[[Path, BlobInfo], BlobInfo]


class _WriterThread:
    """Writes buffers to ``fd`` in order; syncs every SYNC_EVERY bytes to spread the writeback."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._queue: queue.Queue[bytes | memoryview | None] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self._since_sync = 0
        self._thread = threading.Thread(target=self._run, name="kerneld-blob-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.error is not None:
                continue
            try:
                _write_all(self._fd, item)
                self._since_sync += len(item)
                if self._since_sync >= SYNC_EVERY:
                    os.fdatasync(self._fd)
                    self._since_sync = 0
            except BaseException as exc:
                self.error = exc

    def put(self, data: bytes | memoryview) -> None:
        self._queue.put(data)

    def finish(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _open_partial(part_path: Path) -> int:
    """Open (creating) a partial file for writing. A commit makes the file read-only (0444)
    before moving it into ``blobs/``; a daemon killed in between leaves a read-only partial
    that its next run, which is not root, could not open: ours to make writable again (its
    bytes are re-hashed on resume like any other partial's)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(part_path, flags, 0o600)
    except PermissionError:
        st = os.lstat(part_path)  # FileNotFoundError: not the case above; let it propagate
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise
        os.chmod(part_path, 0o600)
        return os.open(part_path, flags, 0o600)


class BlobWriter:
    """A resumable writer that commits against an expected digest.

    Obtain one from ``store.blobs.open_writer``. Call :meth:`write` with consecutive chunks from
    :attr:`offset`, then :meth:`commit`. On any failure call :meth:`abort` (or use it as a context
    manager: leaving the block without a commit aborts and deletes the partial file, except for a
    plain interruption, which :meth:`close` keeps for a later resume).
    """

    def __init__(
        self,
        part_path: Path,
        expected: Expected,
        on_commit: CommitFn,
        *,
        on_close: Callable[[], None] = lambda: None,
        context: dict[str, str | None] | None = None,
    ) -> None:
        self.expected = expected
        self.path = part_path
        self._on_commit = on_commit
        self._on_close = on_close
        self._ctx: dict[str, str | None] = dict(context or {})
        self._closed = False
        self._thread: _WriterThread | None = None
        self._sha256 = hashlib.sha256()
        self._sha1 = hashlib.sha1(usedforsecurity=False) if expected.git_sha1 else None
        if self._sha1 is not None:
            self._sha1.update(git_blob_header(expected.size))
        fd = _open_partial(part_path)
        if not try_flock(fd):
            os.close(fd)
            raise IngestInProgressError(
                f"another writer is already ingesting {expected.key[0]}:{expected.key[1]}; "
                "wait for it (the daemon fetches each file once)",
                **self._ctx,
            ) from None
        self._fd = fd
        try:
            self.offset = self._resume()
        except BaseException:
            os.close(fd)
            raise

    def _resume(self) -> int:
        """Hash the bytes an earlier, interrupted writer left behind (read once)."""
        size = os.fstat(self._fd).st_size
        if size > self.expected.size:
            os.ftruncate(self._fd, 0)
            size = 0
        done = 0
        while done < size:
            chunk = os.pread(self._fd, min(READ_CHUNK, size - done), done)
            if not chunk:
                break
            self._update(chunk)
            done += len(chunk)
        os.ftruncate(self._fd, done)
        os.lseek(self._fd, done, os.SEEK_SET)
        if done:
            log.info("resuming ingest of %s at offset %d", self.path.name, done)
        return done

    def _update(self, data: bytes | memoryview) -> None:
        self._sha256.update(data)
        if self._sha1 is not None:
            self._sha1.update(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hash and write the next chunk. Raises SizeMismatchError past the announced size."""
        if self._closed:
            raise StoreError("write on a closed BlobWriter", **self._ctx)
        chunk: bytes | memoryview
        if isinstance(data, bytes) or (
            isinstance(data, memoryview) and isinstance(data.obj, bytes)
        ):
            chunk = data  # immutable: safe to hand to the writer thread without a copy
        else:
            chunk = bytes(data)
        if not chunk:
            return
        if self.offset + len(chunk) > self.expected.size:
            actual = self.offset + len(chunk)
            self.abort()
            raise SizeMismatchError(self.expected.size, actual, **self._ctx)
        self._update(chunk)
        try:
            if self._thread is None and self.expected.size >= THREADED_MIN_SIZE:
                self._thread = _WriterThread(self._fd)
            if self._thread is not None:
                if self._thread.error is not None:
                    raise self._thread.error
                self._thread.put(chunk)
            else:
                _write_all(self._fd, chunk)
        except Exception as exc:
            self._fail(exc)
        self.offset += len(chunk)

    def _fail(self, exc: BaseException) -> None:
        self.abort()
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ResourceExhaustedError(
                self.expected.size, self.offset, "file system's free space", **self._ctx
            ) from exc
        raise exc

    def _drain(self) -> None:
        if self._thread is not None:
            self._thread.finish()
            error, self._thread = self._thread.error, None
            if error is not None:
                self._fail(error)

    def commit(self) -> BlobInfo:
        """Check size and digest, make the bytes durable and move them into the store."""
        if self._closed:
            raise StoreError("commit on a closed BlobWriter", **self._ctx)
        self._drain()
        exp = self.expected
        if self.offset != exp.size:
            actual = self.offset
            self.abort()
            raise SizeMismatchError(exp.size, actual, **self._ctx)
        sha256 = self._sha256.hexdigest()
        git_sha1 = self._sha1.hexdigest() if self._sha1 is not None else None
        if exp.sha256 is not None and sha256 != exp.sha256:
            self.abort()
            raise DigestMismatchError("sha256", exp.sha256, sha256, **self._ctx)
        if exp.git_sha1 is not None and git_sha1 != exp.git_sha1:
            self.abort()
            raise DigestMismatchError("git blob sha1", exp.git_sha1, git_sha1 or "", **self._ctx)
        try:
            os.fsync(self._fd)
            os.fchmod(self._fd, FILE_MODE_BLOB)
        except OSError as exc:
            self._fail(exc)
        faults.point("blob.synced")
        try:
            info = self._on_commit(self.path, BlobInfo(sha256, exp.size, git_sha1))
        except BaseException:
            self.abort()
            raise
        self._close()
        return info

    def abort(self) -> None:
        """Discard the partial file (it cannot be resumed)."""
        if self._closed:
            return
        if self._thread is not None:
            self._thread.finish()
            self._thread = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._close()

    def close(self) -> None:
        """Stop without committing but keep the partial file for a later resume."""
        if self._closed:
            return
        self._drain()
        self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)
            self._on_close()

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None or isinstance(exc, (KeyboardInterrupt, ConnectionError, TimeoutError)):
            self.close()
        else:
            self.abort()
