"""Where an export's files go, and the checks that keep it a mirror.

An export (and `kerneldctl publish --mirror`) writes through a `Target`: a directory this
process writes (`DirTarget`, each file atomic), or a stream of `FileOp`s to a caller who writes
them (`StreamTarget`: the daemon never writes a caller-chosen path; `kerneld.mirror.receive`
is the other end, and checks every path with `check_stream_path`). Blobs are re-hashed while
they are copied out of the store, so store corruption never reaches a mirror.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kerneld.mirror.documents import INFO, MirrorFormatError, MirrorWriter, blob_path, parse_info
from kerneld.store import BlobProvider
from kerneld.store.manifest import ManifestEntry

CHUNK = 1 << 20


class ExportError(ValueError):
    """The export cannot be done as asked; nothing was written (or the write failed)."""


class Target:
    """Where an export's files go: a directory this process writes (DirTarget), or a stream to
    the caller who writes them (StreamTarget: the daemon never writes a caller-chosen path)."""

    def read(self, rel: str) -> bytes | None:
        """A document already at the destination (written earlier in this export included)."""
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, rel: str) -> None:
        """Remove `rel` if present (a signature of bytes that are gone)."""
        raise NotImplementedError

    def has_blob(self, sha256: str, size: int) -> bool:
        raise NotImplementedError

    def put_blob(self, blobs: BlobProvider, entry: ManifestEntry) -> int:
        """Copy one blob out of the store, re-hashing it; returns its size."""
        raise NotImplementedError


class DirTarget(Target):
    def __init__(self, root: Path, name: str = "") -> None:
        check_mirror_dir(root)
        self.root = root
        self.writer = MirrorWriter(root, name=name)

    def read(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        self.writer.write_file(rel, data)

    def delete(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    def has_blob(self, sha256: str, size: int) -> bool:
        return self.writer.has_blob(sha256, size)

    def put_blob(self, blobs: BlobProvider, entry: ManifestEntry) -> int:
        return _copy_blob(blobs, self.root, entry)


@dataclass(frozen=True)
class FileOp:
    """One step of a streamed export: `file` starts `path` (`size` bytes; `data` its first
    bytes), `data` continues it, `delete` removes `path` at the destination."""

    kind: str
    path: str
    size: int = 0
    data: bytes = b""


class StreamTarget(Target):
    """Sends the export's files to `send` in chunks of at most CHUNK bytes.

    `existing`: the documents the caller's destination holds (so manifests, refs and signatures
    merge as they would on disk); `present`: sha256 of the blobs it already has.
    """

    def __init__(
        self,
        existing: dict[str, bytes],
        present: Iterable[str],
        send: Callable[[FileOp], None],
    ) -> None:
        self.docs = dict(existing)
        self.present = set(present)
        self.send = send

    def read(self, rel: str) -> bytes | None:
        return self.docs.get(rel)

    def write(self, rel: str, data: bytes) -> None:
        self.docs[rel] = data
        self.send(FileOp("file", rel, len(data), data[:CHUNK]))
        for at in range(CHUNK, len(data), CHUNK):
            self.send(FileOp("data", rel, len(data), data[at : at + CHUNK]))

    def delete(self, rel: str) -> None:
        if self.docs.pop(rel, None) is not None:
            self.send(FileOp("delete", rel))

    def has_blob(self, sha256: str, size: int) -> bool:
        return sha256 in self.present

    def put_blob(self, blobs: BlobProvider, entry: ManifestEntry) -> int:
        rel = blob_path(entry.sha256)
        h = hashlib.sha256()
        n = 0
        self.send(FileOp("file", rel, entry.size))
        with _open_store_blob(blobs, entry) as src:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                n += len(chunk)
                if n > entry.size:
                    break
                self.send(FileOp("data", rel, entry.size, chunk))
        _check_copied(entry, h.hexdigest(), n)
        self.present.add(entry.sha256)
        return n


def check_mirror_dir(root: Path) -> None:
    """ExportError unless `root` is absent, empty, or a kerneld mirror directory."""
    if root.exists() and not root.is_dir():
        raise ExportError(f"{root} exists and is not a directory")
    info = root / INFO
    if info.is_file():
        try:
            parse_info(info.read_bytes())
        except MirrorFormatError as exc:
            raise ExportError(f"{root}: {exc}") from None
    elif root.is_dir() and any(root.iterdir()):
        raise ExportError(
            f"{root} is not empty and is not a kerneld mirror (no {INFO}); choose an empty or "
            "new directory"
        )


def _open_store_blob(blobs: BlobProvider, f: ManifestEntry) -> IO[bytes]:
    try:
        return blobs.open_blob(f.sha256)
    except FileNotFoundError:
        raise ExportError(
            f"blob {f.sha256} ({f.path}) vanished from the store during export"
        ) from None


def _check_copied(f: ManifestEntry, digest: str, size: int) -> None:
    if digest != f.sha256 or size != f.size:
        raise ExportError(
            f"the store's copy of {f.path} (blob {f.sha256}) is corrupt; run "
            "`kerneldctl verify --repair` and prefetch again"
        )


def _copy_blob(blobs: BlobProvider, root: Path, f: ManifestEntry) -> int:
    """Copy one blob out of the store, re-hashing it; returns its size."""
    with _open_store_blob(blobs, f) as src:
        return copy_blob_into(root, f.sha256, src, lambda digest, n: _check_copied(f, digest, n))


def copy_blob_into(
    root: Path, sha256: str, src: IO[bytes], check: Callable[[str, int], None]
) -> int:
    """Copy `src` into the mirror at `root` as the blob `sha256`, hashing it on the way;
    `check(digest, size)` raises when the bytes are not the promised ones, and then nothing is
    left behind. Atomic and durable, as every mirror file; returns the size."""
    dest = root / blob_path(sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    h = hashlib.sha256()
    n = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        check(h.hexdigest(), n)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


_DOC_RE = re.compile(
    r"^(mirror-info|refs/[^/]+/[^/]+\.json(\.sig)?|manifests/[^/]+/[^/]+/[0-9a-f]{40}\.json(\.sig)?)$"
)
_BLOB_RE = re.compile(r"^blobs/sha256/([0-9a-f]{2})/(\1[0-9a-f]{62})$")


def check_doc_rel(rel: str) -> None:
    """ExportError unless `rel` is where the mirror layout keeps a document (or its .sig)."""
    if not _DOC_RE.match(rel) or ".." in rel:
        raise ExportError(f"not a mirror document path: {rel!r}")


def check_stream_path(rel: str) -> str | None:
    """A streamed file's path checked against the mirror layout; the blob's sha256 (which the
    receiver checks the bytes against) for a blob, else None. ValueError for any other path."""
    m = _BLOB_RE.match(rel)
    if m:
        return m.group(2)
    check_doc_rel(rel)
    return None
