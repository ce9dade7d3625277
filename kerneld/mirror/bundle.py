"""Read a mirror bundle (a directory or a tar file) without trusting anything in it.

An air-gapped mirror arrives on removable media or a file share: its paths, file types and sizes
are hostile until proven otherwise. Opening a bundle scans it completely first and refuses it
(:class:`BundleError`) on any path outside the layout's character set, `..`, absolute names,
symlinks, hard links, devices, fifos, duplicate tar members, sizes beyond the end of the archive
(a truncated or lying tar) and more members than any real mirror has. Nothing is extracted to
disk: documents are read into memory (bounded), blobs are streamed into the store's verified
ingest.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol, cast

from kerneld.mirror.documents import INFO

#: Refs, manifests, signatures and mirror-info are small.
MAX_DOC_BYTES = 16 << 20
#: More members than this is not a mirror but an attack on memory.
MAX_MEMBERS = 2_000_000
#: A tar's documents (manifests, refs, signatures: two per kernel revision and per repo) come
#: first; more of them, or more bytes of them, than any real mirror has refuses it early.
MAX_DOCUMENTS = 20_000
MAX_DOCUMENT_BYTES = 256 << 20
#: Blobs that no manifest names (left over by merged exports) are tolerated, this many.
MAX_UNLISTED = 10_000
#: No single kernel file is this big (the importer has the same bound per manifest entry).
MAX_MEMBER_BYTES = 64 << 30
CHUNK = 1 << 20
#: tarfile's extraction filters (PEP 706) exist from 3.10.12 / 3.11.4 / 3.12; Debian 12 ships
#: 3.11.2. They are an extra check here, never the only one.
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_SAFE_PART = re.compile(r"^[A-Za-z0-9._+-]{1,255}$")
#: What reading through a damaged compressed tar raises besides tarfile's own errors: gzip's
#: BadGzipFile and bz2's "Invalid data stream" are OSErrors, zlib and lzma have their own.
DECOMPRESSION_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)
_READ_ERRORS: tuple[type[Exception], ...] = (tarfile.TarError, *DECOMPRESSION_ERRORS)


class BundleError(ValueError):
    """The bundle is unsafe, malformed or truncated: refused as a whole."""


@dataclass(frozen=True, slots=True)
class Entry:
    rel: str
    size: int
    offset: int = -1
    """Where a tar member's data starts in the (uncompressed) archive; -1 in a directory."""


def _check_rel(name: str) -> str:
    """A member name -> normalised relative POSIX path; BundleError if unsafe."""
    if "\0" in name or "\\" in name:
        raise BundleError(f"refusing member {name!r}: NUL or backslash in its name")
    if name.startswith("/"):
        raise BundleError(f"refusing member {name!r}: absolute path")
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if name in ("", "."):
        return ""
    parts = PurePosixPath(name).parts
    for part in parts:
        if part == "..":
            raise BundleError(f"refusing member {name!r}: path traversal ('..')")
        if not _SAFE_PART.match(part) or part == ".":
            raise BundleError(f"refusing member {name!r}: unexpected characters in its name")
    return "/".join(parts)


class Bundle:
    """Common interface of directory and tar bundles."""

    description: str
    files: dict[str, Entry]

    def read_doc(self, rel: str) -> bytes | None:
        """A small file's bytes, or None when absent."""
        raise NotImplementedError

    def open_blob(self, rel: str) -> AbstractContextManager[IO[bytes]]:
        """A binary stream of a listed regular file."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _doc_entry(self, rel: str) -> Entry | None:
        entry = self.files.get(rel)
        if entry is not None and entry.size > MAX_DOC_BYTES:
            raise BundleError(f"{rel} declares {entry.size} bytes, over the {MAX_DOC_BYTES} limit")
        return entry


class DirBundle(Bundle):
    """A mirror directory. Symlinks and special files anywhere under it refuse the bundle."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = f"directory {root}"
        self.files = {}
        st = os.lstat(root)
        if stat.S_ISLNK(st.st_mode):
            raise BundleError(f"{root} is a symlink; give the real directory")
        count = 0
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            base = Path(dirpath)
            for name in (*dirnames, *filenames):
                count += 1
                if count > MAX_MEMBERS:
                    raise BundleError(f"more than {MAX_MEMBERS} entries: not a kerneld mirror")
                path = base / name
                rel = path.relative_to(root).as_posix()
                if name.startswith(".tmp-"):
                    continue  # an interrupted export's temporary file
                _check_rel(rel)
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    raise BundleError(f"refusing {rel}: symlinks are not allowed in a mirror")
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    raise BundleError(f"refusing {rel}: not a regular file (device, fifo, socket)")
                self.files[rel] = Entry(rel, os.lstat(path).st_size)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def read_doc(self, rel: str) -> bytes | None:
        entry = self._doc_entry(rel)
        if entry is None:
            return None
        fd = os.open(self.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise BundleError(f"refusing {rel}: not a regular file")
            data = fh.read(MAX_DOC_BYTES + 1)
        if len(data) > MAX_DOC_BYTES:
            raise BundleError(f"{rel} grew over the {MAX_DOC_BYTES} limit while being read")
        return data

    def open_blob(self, rel: str) -> AbstractContextManager[IO[bytes]]:
        return self._open(rel)

    @contextmanager
    def _open(self, rel: str) -> Iterator[IO[bytes]]:
        fd = os.open(self.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise BundleError(f"refusing {rel}: not a regular file")
            yield fh


class _CappedReader(io.RawIOBase):
    """The archive's (decompressed) byte stream, refusing any single read over `cap`.

    tarfile reads a pax or GNU long-name header whole, whatever size it declares: a 1 GiB header
    of zeros compresses to a megabyte. Capping every read keeps a hostile header from costing
    more memory than a document may have.
    """

    def __init__(self, raw: _Stream, cap: int) -> None:
        self._raw = raw
        self._cap = cap

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > self._cap:
            raise BundleError(
                f"the tar asks to read {size} bytes at once (a header or member over the "
                f"{self._cap}-byte limit): not a kerneld mirror"
            )
        return self._raw.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()


class _MemberReader(io.RawIOBase):
    """`size` bytes at `offset` of the archive stream (a blob, read without a TarInfo)."""

    def __init__(self, fileobj: _Stream, offset: int, size: int, rel: str) -> None:
        self._fileobj = fileobj
        self._offset = offset
        self._size = size
        self._pos = 0
        self._rel = rel

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        self._fileobj.seek(self._offset + self._pos)
        data = self._fileobj.read(want)
        if not data:
            raise BundleError(f"{self._rel}: the tar is truncated (it ends inside this member)")
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class _Stream(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...
    def seek(self, offset: int, whence: int = ..., /) -> int: ...
    def tell(self) -> int: ...


def _open_stream(raw: IO[bytes]) -> tuple[_Stream, bool]:
    """The archive's uncompressed stream and whether it was compressed (by its magic bytes)."""
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), True
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw, "rb"), True
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw, "rb"), True
    return raw, False


#: Called once when the scan of a tar meets its first blob, with the documents read so far
#: (`mirror export` writes documents first): the importer checks signatures there, before the
#: blobs are scanned, and answers which blob paths the (signed) manifests name.
Gate = Callable[["Bundle"], "frozenset[str] | None"]


class TarBundle(Bundle):
    """A mirror packed in a tar file (plain or compressed). Read in place, never extracted.

    Documents (everything outside `blobs/`) must come before the blobs, as `mirror export`
    writes them; they are read into memory as the scan passes them (bounded in count and bytes).
    Blobs are only listed. When a `gate` is given it runs at the first blob, so an unsigned or
    forged bundle is refused after its documents, not after a scan of every member.
    """

    def __init__(
        self, path: Path, *, gate: Gate | None = None, use_filter: bool = HAS_DATA_FILTER
    ) -> None:
        self.description = f"tar file {path}"
        self.files = {}
        self._docs: dict[str, bytes] = {}
        self._use_filter = use_filter and HAS_DATA_FILTER
        self._raw = path.open("rb")  # closed by close()
        try:
            archive_size = os.fstat(self._raw.fileno()).st_size
            stream, compressed = _open_stream(self._raw)
            self._stream = _CappedReader(stream, MAX_DOC_BYTES + (1 << 20))
            try:
                self._tar = tarfile.open(fileobj=self._stream, mode="r:")  # noqa: SIM115
            except _READ_ERRORS as exc:
                raise BundleError(f"{path} is not a readable tar file: {exc}") from None
            try:
                self._scan(archive_size, compressed, gate)
            except BaseException:
                self._tar.close()
                raise
        except BaseException:
            self._raw.close()
            raise

    def _check_member(self, member: tarfile.TarInfo, rel: str) -> None:
        """Our own checks (every Python); the tarfile data filter in addition where it exists."""
        if member.issym() or member.islnk():
            raise BundleError(
                f"refusing member {rel!r}: links are not allowed in a mirror "
                f"(-> {member.linkname!r})"
            )
        if member.isdir():
            return
        if not member.isreg() or member.issparse():
            raise BundleError(
                f"refusing member {rel!r}: not a regular file (device, fifo or sparse)"
            )
        if member.size < 0 or member.size > MAX_MEMBER_BYTES:
            raise BundleError(
                f"refusing member {rel!r}: it declares {member.size} bytes (limit "
                f"{MAX_MEMBER_BYTES})"
            )
        if self._use_filter:
            try:
                tarfile.data_filter(member, "/nonexistent-kerneld-import")
            except tarfile.TarError as exc:  # FilterError is a TarError
                raise BundleError(f"refusing member {rel!r}: {exc}") from None

    def _scan(self, archive_size: int, compressed: bool, gate: Gate | None) -> None:
        seen: set[str] = set()
        count = docs = unlisted = doc_bytes = 0
        expected: frozenset[str] | None = None
        in_blobs = False
        try:
            while (member := self._tar.next()) is not None:
                # tarfile keeps every TarInfo otherwise (the memory of a 300,000-member bomb)
                cast(Any, self._tar).members.clear()
                count += 1
                if count > MAX_MEMBERS:
                    raise BundleError(f"more than {MAX_MEMBERS} members: not a kerneld mirror")
                rel = _check_rel(member.name)
                if rel in seen:
                    raise BundleError(
                        f"refusing member {rel!r}: it appears twice (a later copy could "
                        "silently replace a checked one)"
                    )
                seen.add(rel)
                if not compressed and member.offset_data + member.size > archive_size:
                    raise BundleError(
                        f"member {rel!r} declares {member.size} bytes, past the end of the "
                        f"archive ({archive_size} bytes): the tar is truncated or corrupt"
                    )
                self._check_member(member, rel)
                is_blob = rel == "blobs" or rel.startswith("blobs/")
                if is_blob and not in_blobs:
                    in_blobs = True
                    if gate is not None:
                        expected = gate(self)
                if not is_blob:
                    if in_blobs:
                        raise BundleError(
                            f"member {rel!r} comes after the blobs: a tar bundle lists its "
                            "documents first (as `kerneldctl mirror export` writes it); "
                            "re-export it, or import the unpacked directory"
                        )
                    docs += 1
                    if docs > MAX_DOCUMENTS:
                        raise BundleError(
                            f"more than {MAX_DOCUMENTS} documents before the first blob: not "
                            "a kerneld mirror"
                        )
                elif expected is not None and rel not in expected:
                    unlisted += 1
                    if unlisted > MAX_UNLISTED:
                        raise BundleError(
                            f"more than {MAX_UNLISTED} members that no manifest names: not a "
                            "kerneld mirror"
                        )
                if member.isdir():
                    continue
                self.files[rel] = Entry(rel, member.size, member.offset_data)
                if not is_blob and member.size <= MAX_DOC_BYTES:
                    doc_bytes += member.size
                    if doc_bytes > MAX_DOCUMENT_BYTES:
                        raise BundleError(
                            f"the documents total over {MAX_DOCUMENT_BYTES} bytes: not a "
                            "kerneld mirror"
                        )
                    self._docs[rel] = (
                        self._read_member(rel, member.offset_data, member.size)
                        if member.size
                        else b""
                    )
        except tarfile.TarError as exc:
            raise BundleError(f"the tar is corrupt or truncated: {exc}") from None
        except EOFError as exc:
            raise BundleError(f"the tar is truncated: {exc}") from None
        except DECOMPRESSION_ERRORS as exc:
            raise BundleError(f"the compressed tar is corrupt: {exc}") from None
        if not compressed:
            self._check_end_marker(archive_size)

    def _read_member(self, rel: str, offset: int, size: int) -> bytes:
        with self._reader(rel, offset, size) as fh:
            data = fh.read(size)
        if len(data) != size:
            raise BundleError(f"{rel}: the tar is truncated ({len(data)} of {size} bytes)")
        return data

    def _reader(self, rel: str, offset: int, size: int) -> io.BufferedReader:
        return io.BufferedReader(_MemberReader(self._stream, offset, size, rel), CHUNK)

    def _check_end_marker(self, archive_size: int) -> None:
        """Python's tarfile stops quietly at a cut-off header: demand the end-of-archive blocks,
        so a truncated copy is refused instead of silently missing its last members."""
        end = self._tar.offset
        if end + 1024 > archive_size:
            raise BundleError(
                "the tar is truncated: it ends without the end-of-archive marker (was the "
                "copy interrupted?)"
            )
        self._stream.seek(end)
        if self._stream.read(1024) != bytes(1024):
            raise BundleError(
                f"the tar is corrupt or truncated: unreadable data at offset {end} where the "
                "next member or the end-of-archive marker should be"
            )

    def read_doc(self, rel: str) -> bytes | None:
        entry = self._doc_entry(rel)
        if entry is None:
            return None
        data = self._docs.get(rel)
        if data is None:  # a blob path read as a document
            try:
                data = self._read_member(rel, entry.offset, entry.size)
            except _READ_ERRORS as exc:
                raise BundleError(f"{rel}: the tar is truncated or corrupt: {exc}") from None
        return data

    def open_blob(self, rel: str) -> AbstractContextManager[IO[bytes]]:
        return self._open(rel)

    @contextmanager
    def _open(self, rel: str) -> Iterator[IO[bytes]]:
        entry = self.files[rel]
        with self._reader(rel, entry.offset, entry.size) as fh:
            yield fh

    def close(self) -> None:
        try:
            self._tar.close()
        finally:
            self._raw.close()


def open_bundle(
    source: str | os.PathLike[str],
    *,
    gate: Gate | None = None,
    use_filter: bool = HAS_DATA_FILTER,
) -> Bundle:
    """A directory -> DirBundle, a file -> TarBundle; BundleError for anything else.

    `gate`: see TarBundle. `use_filter`: also run tarfile's data filter (Python >= 3.10.12 /
    3.11.4); our own checks run either way, so older Pythons are as safe.
    """
    path = Path(source)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise BundleError(f"{path} does not exist") from None
    except OSError as exc:
        raise BundleError(f"cannot open {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        bundle: Bundle = DirBundle(path)
    elif stat.S_ISREG(st.st_mode):
        bundle = TarBundle(path, gate=gate, use_filter=use_filter)
    elif stat.S_ISLNK(st.st_mode):
        raise BundleError(f"{path} is a symlink; give the real path")
    else:
        raise BundleError(f"{path} is neither a directory nor a tar file")
    if INFO not in bundle.files:
        bundle.close()
        raise BundleError(
            f"{bundle.description} has no {INFO} file: not a kerneld mirror "
            "(made by `kerneldctl mirror export`)"
        )
    return bundle
