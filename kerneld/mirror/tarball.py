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
