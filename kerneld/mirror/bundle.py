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

import lzma
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from kerneld.mirror.layout import INFO

#: Refs, manifests, signatures and mirror-info are small.
MAX_DOC_BYTES = 16 << 20
#: More members than this is not a mirror but an attack on memory.
MAX_MEMBERS = 2_000_000
_SAFE_PART = re.compile(r"^[A-Za-z0-9._+-]{1,255}$")
#: What reading through a damaged compressed tar raises besides tarfile's own errors: gzip's
#: BadGzipFile and bz2's "Invalid data stream" are OSErrors, zlib and lzma have their own.
DECOMPRESSION_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)
_READ_ERRORS: tuple[type[Exception], ...] = (tarfile.TarError, *DECOMPRESSION_ERRORS)


class BundleError(ValueError):
    """The bundle is unsafe, malformed or truncated: refused as a whole."""


@dataclass(frozen=True)
class Entry:
    rel: str
    size: int


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


class TarBundle(Bundle):
    """A mirror packed in a tar file (plain or compressed). Read in place, never extracted."""

    def __init__(self, path: Path) -> None:
        self.description = f"tar file {path}"
        self.files = {}
        self._members: dict[str, tarfile.TarInfo] = {}
        archive_size = path.stat().st_size
        with path.open("rb") as fh:
            magic = fh.read(6)
        compressed = magic.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"))
        try:
            self._tar = tarfile.open(path, "r:*" if compressed else "r:")  # noqa: SIM115
        except _READ_ERRORS as exc:
            raise BundleError(f"{path} is not a readable tar file: {exc}") from None
        try:
            self._scan(archive_size, compressed)
        except BaseException:
            self._tar.close()
            raise

    def _scan(self, archive_size: int, compressed: bool) -> None:
        seen: set[str] = set()
        count = 0
        try:
            for member in self._tar:
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
                if member.isdir():
                    continue
                if member.issym() or member.islnk():
                    raise BundleError(
                        f"refusing member {rel!r}: links are not allowed in a mirror "
                        f"(-> {member.linkname!r})"
                    )
                if not member.isreg() or member.issparse():
                    raise BundleError(
                        f"refusing member {rel!r}: not a regular file (device, fifo or sparse)"
                    )
                try:
                    tarfile.data_filter(member, "/nonexistent-kerneld-import")
                except tarfile.FilterError as exc:
                    raise BundleError(f"refusing member {rel!r}: {exc}") from None
                if member.size < 0 or (
                    not compressed and member.offset_data + member.size > archive_size
                ):
                    raise BundleError(
                        f"member {rel!r} declares {member.size} bytes, past the end of the "
                        f"archive ({archive_size} bytes): the tar is truncated or corrupt"
                    )
                self._members[rel] = member
                self.files[rel] = Entry(rel, member.size)
        except tarfile.TarError as exc:
            raise BundleError(f"the tar is corrupt or truncated: {exc}") from None
        except EOFError as exc:
            raise BundleError(f"the tar is truncated: {exc}") from None
        except DECOMPRESSION_ERRORS as exc:
            raise BundleError(f"the compressed tar is corrupt: {exc}") from None
        if not compressed:
            self._check_end_marker(archive_size)

    def _check_end_marker(self, archive_size: int) -> None:
        """Python's tarfile stops quietly at a cut-off header: demand the end-of-archive blocks,
        so a truncated copy is refused instead of silently missing its last members."""
        end = self._tar.offset
        fileobj = self._tar.fileobj
        if fileobj is None or end + 1024 > archive_size:
            raise BundleError(
                "the tar is truncated: it ends without the end-of-archive marker (was the "
                "copy interrupted?)"
            )
        fileobj.seek(end)
        if fileobj.read(1024) != bytes(1024):
            raise BundleError(
                f"the tar is corrupt or truncated: unreadable data at offset {end} where the "
                "next member or the end-of-archive marker should be"
            )

    def read_doc(self, rel: str) -> bytes | None:
        entry = self._doc_entry(rel)
        if entry is None:
            return None
        with self.open_blob(rel) as fh:
            try:
                data = fh.read(entry.size)
            except _READ_ERRORS as exc:
                raise BundleError(f"{rel}: the tar is truncated or corrupt: {exc}") from None
        if len(data) != entry.size:
            raise BundleError(f"{rel}: the tar is truncated ({len(data)} of {entry.size} bytes)")
        return data

    def open_blob(self, rel: str) -> AbstractContextManager[IO[bytes]]:
        return self._open(rel)

    @contextmanager
    def _open(self, rel: str) -> Iterator[IO[bytes]]:
        member = self._members[rel]
        fh = self._tar.extractfile(member)
        if fh is None:  # pragma: no cover - regular files always have a file object
            raise BundleError(f"{rel}: cannot be read from the tar")
        with fh:
            yield fh

    def close(self) -> None:
        self._tar.close()


def open_bundle(source: str | os.PathLike[str]) -> Bundle:
    """A directory -> DirBundle, a file -> TarBundle; BundleError for anything else."""
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
        bundle = TarBundle(path)
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
