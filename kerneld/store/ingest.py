"""Blobs in: the ingester (containerd's ``content.Ingester``). Every write is reserved first
(``space``), written resumably by a `BlobWriter` outside the lock, and committed against the
digest it was announced with: a ``pending`` row, the rename into ``blobs/``, then ``live``.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from . import faults
from .blobs import BlobInfo, BlobWriter, Expected
from .errors import SizeMismatchError, UnsupportedFileTypeError, log_context
from .layout import DIR_MODE_PUBLIC, fsync_dir
from .space import Space
from .state import StoreState

log = logging.getLogger("kerneld.store")

READ_CHUNK = 1 << 20


class Ingest:
    """Finds, reads and writes blobs."""

    def __init__(self, state: StoreState, space: Space) -> None:
        self._state = state
        self._space = space

    def has_blob(self, sha256: str) -> bool:
        """True if the blob is present. A hit also claims it: GC leaves it alone for
        ``orphan_grace_s``, so the fetcher can skip the download and publish with it."""
        return self.find_blob(sha256=sha256) is not None

    def find_blob(
        self, *, sha256: str | None = None, git_sha1: str | None = None
    ) -> BlobInfo | None:
        """The live blob with this sha256, or (for plain git files) this git blob sha1."""
        state, index = self._state, self._state.index
        with state.lock:
            row = None
            if sha256 is not None:
                row = index.get_blob(sha256)
            elif git_sha1 is not None:
                row = index.find_blob_by_git_sha1(git_sha1)
            if row is None or row.state != "live":
                return None
            if not state.read_only:
                index.claim_blob(row.sha256, time.time())
            return BlobInfo(row.sha256, row.size, row.git_sha1, created=False)

    def open_blob(self, sha256: str) -> BinaryIO:
        """A live blob's bytes (FileNotFoundError: not in the store, or collected meanwhile)."""
        return self._state.layout.blob_path(sha256).open("rb")

    def open_writer(self, expected: Expected, **ctx: str | None) -> BlobWriter:
        """A resumable writer for one file; ``writer.offset`` says where to continue.

        Space for ``expected.size`` bytes is reserved now (``ResourceExhaustedError`` if it does
        not fit even after GC) and released when the writer commits, aborts or closes.
        """
        self._state.writable()
        self._space.reserve(expected.size, ctx)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._space.unreserve(expected.size)

        try:
            return BlobWriter(
                self._state.layout.partial_path(*expected.key),
                expected,
                lambda part, info: self._commit_blob(part, info, ctx),
                on_close=release,
                context=dict(ctx),
            )
        except BaseException:
            release()
            raise

    def ingest(
        self,
        source: bytes | Iterable[bytes] | BinaryIO,
        *,
        size: int,
        sha256: str | None = None,
        git_sha1: str | None = None,
        **ctx: str | None,
    ) -> BlobInfo:
        """Ingest a whole file from bytes, an iterable of chunks or a binary file object.

        If the blob is already present nothing is read (``created=False``).
        """
        expected = Expected(size, sha256=sha256, git_sha1=git_sha1)
        found = self.find_blob(sha256=sha256, git_sha1=git_sha1 if sha256 is None else None)
        if found is not None and (git_sha1 is None or found.git_sha1 in (None, git_sha1)):
            return found
        with self.open_writer(expected, **ctx) as writer:
            skip = writer.offset
            for piece in _chunks(source):
                chunk = piece
                if skip:
                    if len(chunk) <= skip:
                        skip -= len(chunk)
                        continue
                    chunk, skip = chunk[skip:], 0
                writer.write(chunk)
            return writer.commit()

    def ingest_file(
        self,
        path: str | os.PathLike[str],
        *,
        sha256: str | None = None,
        git_sha1: str | None = None,
        size: int | None = None,
        **ctx: str | None,
    ) -> BlobInfo:
        """Ingest a local file (mirror import). Symlinks, devices and fifos are rejected."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if os.path.islink(path):
                raise UnsupportedFileTypeError(
                    "refusing to ingest a symlink", path=os.fspath(path), **ctx
                ) from exc
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsupportedFileTypeError(
                    "refusing to ingest something that is not a regular file",
                    path=os.fspath(path),
                    **ctx,
                )
            if size is not None and size != st.st_size:
                raise SizeMismatchError(size, st.st_size, path=os.fspath(path), **ctx)
            return self.ingest(f, size=st.st_size, sha256=sha256, git_sha1=git_sha1, **ctx)

    def _commit_blob(self, part: Path, info: BlobInfo, ctx: dict[str, str | None]) -> BlobInfo:
        state, index = self._state, self._state.index
        final = state.layout.blob_path(info.sha256)
        with state.lock:
            state.writable()
            row = index.get_blob(info.sha256)
            if row is not None and row.state == "live" and final.exists():
                part.unlink(missing_ok=True)
                index.claim_blob(info.sha256, time.time())
                if info.git_sha1 and row.git_sha1 is None:
                    with index.tx() as conn:
                        index.put_blob(conn, info.sha256, info.size, info.git_sha1, "live")
                log.info("blob %s already present (%s)", info.sha256, log_context(ctx))
                return replace(info, created=False)
            with index.tx() as conn:
                index.put_blob(conn, info.sha256, info.size, info.git_sha1, "pending")
            faults.point("blob.pending")
            bucket = final.parent
            if not bucket.is_dir():
                bucket.mkdir(mode=DIR_MODE_PUBLIC, exist_ok=True)
                os.chmod(bucket, DIR_MODE_PUBLIC)
                fsync_dir(bucket.parent)
            os.replace(part, final)
            faults.point("blob.renamed")
            fsync_dir(bucket)
            with index.tx() as conn:
                index.set_blob_state(conn, info.sha256, "live")
            faults.point("blob.live")
        log.info("ingested blob %s (%d bytes) %s", info.sha256, info.size, log_context(ctx))
        return info


def _chunks(source: bytes | Iterable[bytes] | BinaryIO) -> Iterator[bytes | memoryview]:
    if isinstance(source, bytes):
        view = memoryview(source)  # slices of immutable bytes: no copies
        for i in range(0, len(view), 8 << 20):
            yield view[i : i + (8 << 20)]
        return
    read = getattr(source, "read", None)
    if read is not None:
        while chunk := read(READ_CHUNK):
            yield chunk
        return
    yield from source
