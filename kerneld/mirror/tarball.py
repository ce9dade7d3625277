"""A `.tar` mirror destination: assembled in a staging directory, renamed into place.

An export, a publish or a streamed export's receiver that writes a `.tar` starts from the
existing tar's contents (read through the same safety checks as an import) in a staging
directory beside it, and packs it at the end, so a reader never sees a half-written tar.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kerneld.mirror.bundle import BundleError, open_bundle
from kerneld.mirror.destination import CHUNK, ExportError
from kerneld.mirror.documents import INFO


def pack_tar(staging: Path, dest: Path) -> None:
    """Write the staging mirror as a tar beside `dest`, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    mtime = int(time.time())
    files = sorted(
        p.relative_to(staging).as_posix()
        for p in staging.rglob("*")
        if p.is_file() and not p.name.startswith(".tmp-")
    )
    # Documents first, blobs last: a reader streaming the tar sees what to expect early.
    files.sort(key=lambda rel: (rel.startswith("blobs/"), rel != INFO, rel))
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in files:
                    path = staging / rel
                    info = tarfile.TarInfo(rel)
                    info.size = path.stat().st_size
                    info.mode = 0o644
                    info.mtime = mtime
                    with path.open("rb") as fh:
                        tar.addfile(info, fh)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mirror_files(root: Path) -> list[str]:
    """A mirror directory's files in the order a tar of it must list them: documents first,
    mirror-info before the rest, blobs last (the importer checks signatures at the first blob)."""
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".tmp-")
    )
    files.sort(key=lambda rel: (rel.startswith("blobs/"), rel != INFO, rel))
    return files


def stream_bundle(source: Path) -> Iterator[bytes]:
    """A bundle's bytes for an upload: a tar file as it is, a mirror directory as a tar made
    on the fly (headers from tarfile, file bytes read a chunk at a time: memory stays bounded
    whatever the blobs' sizes). What the tar says is checked again by whoever imports it."""
    if not source.is_dir():
        with source.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk
        return
    if not (source / INFO).is_file():
        raise ExportError(f"{source} has no {INFO} file: not a kerneld mirror directory")
    mtime = int(time.time())
    written = 0
    for rel in _mirror_files(source):
        path = source / rel
        info = tarfile.TarInfo(rel)
        info.size = path.stat().st_size
        info.mode, info.mtime = 0o644, mtime
        header = info.tobuf(format=tarfile.PAX_FORMAT)
        yield header
        left = info.size
        with path.open("rb") as fh:
            while left > 0:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    raise ExportError(f"{path} shrank while it was being sent")
                left -= len(chunk)
                yield chunk
        padding = -info.size % tarfile.BLOCKSIZE
        yield b"\0" * padding
        written += len(header) + info.size + padding
    end = 2 * tarfile.BLOCKSIZE
    end += -(written + end) % tarfile.RECORDSIZE
    yield b"\0" * end


def unpack_existing(tar_path: Path, staging: Path) -> None:
    """Copy an existing tar mirror into the staging directory (through the import checks)."""
    try:
        with open_bundle(tar_path) as bundle:
            for rel in bundle.files:
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with bundle.open_blob(rel) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
    except (BundleError, tarfile.TarError, EOFError) as exc:
        raise ExportError(
            f"{tar_path} exists but is not a readable kerneld mirror ({exc}); remove it or "
            "choose another name"
        ) from None


def is_tar_destination(dest: str | os.PathLike[str]) -> bool:
    return os.fspath(dest).endswith(".tar")
