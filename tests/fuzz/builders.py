"""Valid inputs to start from: a signed one-kernel mirror, tar archives of it (with any member
types and names, including hostile ones), Hub tree listings. Used by the hypothesis strategies
and to seed the atheris corpora (fuzz/), so both start from the same well-formed documents.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tests.fuzz import harnesses
from tests.fuzz import invariants as inv

Signer = Callable[[str, bytes], bytes]
#: When the seed bundle says it was exported (2023-11-14).
EXPORTED_AT = 1_700_000_000.0


def variant_files(extra: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
    """A small importable variant whose metadata.json digest covers its files."""
    files = {"__init__.py": b"NAME = 'fuzz'\n", **(extra or {})}
    meta = {
        "id": "_fuzz_kernel_0",
        "name": "fuzz-kernel",
        "version": 1,
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": inv.metadata_digest(files)},
    }
    return {**files, "metadata.json": json.dumps(meta, sort_keys=True).encode()}


def manifest_doc(variants: Mapping[str, Mapping[str, bytes]]) -> dict[str, Any]:
    return {
        "repo_id": inv.REPO,
        "commit": inv.COMMIT,
        "variants": {
            name: {
                "files": [
                    {
                        "path": path,
                        "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "git_sha1": None,
                    }
                    for path, data in sorted(files.items())
                ]
            }
            for name, files in variants.items()
        },
    }


def mirror_files(
    variants: Mapping[str, Mapping[str, bytes]],
    *,
    manifest: bytes | None = None,
    sign: Signer | None = None,
) -> dict[str, bytes]:
    """rel -> bytes of a mirror with one kernel revision (`manifest` overrides its manifest)."""
    from kerneld.mirror.documents import INFO, blob_path, manifest_path, refs_json, refs_path
    from kerneld.mirror.keys import sig_path

    manifest_rel = manifest_path(inv.REPO, inv.COMMIT)
    refs_rel = refs_path(inv.REPO)
    out = {
        INFO: json.dumps({"format": "kerneld-mirror", "version": 1, "name": "fuzz"}).encode(),
        # A real export stamps its refs (an import refuses refs it cannot date); a fixed time
        # keeps the bundles the same from run to run.
        refs_rel: refs_json(
            inv.REPO, {"main": inv.COMMIT, "v1": inv.COMMIT}, {}, exported_at=EXPORTED_AT
        ),
        manifest_rel: manifest
        if manifest is not None
        else json.dumps(manifest_doc(variants), sort_keys=True).encode(),
    }
    if sign is not None:
        for rel in (manifest_rel, refs_rel):
            out[sig_path(rel)] = sign(rel, out[rel])
    for files in variants.values():
        for data in files.values():
            out[blob_path(hashlib.sha256(data).hexdigest())] = data
    return out


@dataclass
class Member:
    """One tar member (or directory entry): `kind` is file, dir, symlink, hardlink, fifo, char,
    block or `huge` (a header announcing `size` bytes the archive does not hold)."""

    name: str
    kind: str = "file"
    data: bytes = b""
    link: str = ""
    size: int | None = None


_TAR_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "fifo": tarfile.FIFOTYPE,
    "char": tarfile.CHRTYPE,
    "block": tarfile.BLKTYPE,
    "huge": tarfile.REGTYPE,
}


def members_of(files: Mapping[str, bytes]) -> list[Member]:
    return [Member(rel, data=data) for rel, data in files.items()]


def build_tar(
    members: Sequence[Member],
    *,
    fmt: Literal[0, 1, 2] = tarfile.PAX_FORMAT,
    compress: bool = False,
) -> bytes:
    """Headers written with tarfile's own encoder, data and padding by hand, so members can lie
    about their size; members tarfile cannot encode at all are left out."""
    buf = io.BytesIO()
    for m in members:
        info = tarfile.TarInfo(m.name)
        info.type = _TAR_TYPES[m.kind]
        info.mode = 0o755 if m.kind == "dir" else 0o644
        info.mtime = 1_700_000_000
        info.linkname = m.link
        data = m.data if m.kind == "file" else b""
        info.size = m.size if m.size is not None else len(data)
        if m.kind == "huge":
            data = b"x" * 512
        try:
            header = info.tobuf(fmt, "utf-8", "surrogateescape")
        except (ValueError, UnicodeError, OverflowError):
            continue
        buf.write(header)
        if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and data:
            buf.write(data)
            buf.write(b"\0" * (-len(data) % tarfile.BLOCKSIZE))
    buf.write(b"\0" * (2 * tarfile.BLOCKSIZE))
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


def build_dir(root: Path, members: Sequence[Member], sandbox: inv.Sandbox) -> None:
    """The same members as a directory bundle (links may point at the sentinel directory)."""
    for m in members:
        name = sandbox.hostile(m.name)
        if name.startswith("/") or "\0" in name or ".." in name.split("/"):
            continue  # a directory cannot hold such a name; the tar variant covers them
        path = root / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if m.kind == "dir":
                path.mkdir(exist_ok=True)
            elif m.kind == "symlink":
                path.symlink_to(sandbox.hostile(m.link) or "missing")
            elif m.kind == "hardlink":
                os.link(sandbox.outside / "canary", path)
            elif m.kind == "fifo":
                os.mkfifo(path)
            elif m.kind in ("file", "huge"):
                path.write_bytes(m.data)
        except (OSError, ValueError):
            continue


def tree_listing(files: Mapping[str, bytes], variant: str, *, lfs: Sequence[str] = ()) -> bytes:
    """The Hub's recursive tree listing of `build/<variant>` for `files`."""
    entries: list[dict[str, Any]] = [
        {"type": "directory", "oid": "0" * 40, "path": f"build/{variant}/sub"}
    ]
    entries += [
        harnesses.tree_entry(f"build/{variant}/{path}", data, lfs=path in lfs)
        for path, data in sorted(files.items())
    ]
    return json.dumps(entries).encode()


def variants_listing(names: Sequence[str]) -> bytes:
    """The Hub's non-recursive listing of `build/`."""
    return json.dumps(
        [{"type": "directory", "oid": "0" * 40, "path": f"build/{n}"} for n in names]
    ).encode()
