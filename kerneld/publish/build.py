"""The build on disk: the variant folders the kernel builder wrote, checked as the store would.

Every file is hashed and named through the store's own checks (`kerneld.store.paths`), and
`metadata.json` and its digest through `kerneld.store.manifest`, so a build the store would
refuse is refused here, with the store's message, before anything is written. Bytecode is left
out, as every upstream leaves it out.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kerneld.publish import PublishError
from kerneld.store import FILE_MODE_EXEC, MetadataDigestError, MetadataError, StoreError
from kerneld.store.manifest import (
    MAX_METADATA_BYTES,
    METADATA_FILE,
    ManifestEntry,
    VariantMetadata,
    check_metadata_digest,
    parse_metadata,
    tree_digest,
)
from kerneld.store.paths import (
    check_unique_paths,
    normalize_mode,
    validate_relpath,
    validate_variant,
)
from kerneld.upstream.base import skipped

CHUNK = 1 << 20
BUILD_DIR = "build"


@dataclass(frozen=True)
class LocalFile:
    path: str
    """Relative to the variant folder, as it will be in the tree."""
    source: Path
    size: int
    sha256: str
    mode: int
    """The tree mode: FILE_MODE_BLOB or FILE_MODE_EXEC."""

    @property
    def executable(self) -> bool:
        return self.mode == FILE_MODE_EXEC


@dataclass(frozen=True)
class LocalVariant:
    name: str
    folder: Path
    files: tuple[LocalFile, ...]
    metadata: VariantMetadata
    tree_digest: str
    """`sha256:<hex>`: the digest the store will give the tree (`kerneldctl info` shows it)."""
    skipped: tuple[str, ...] = ()
    """Bytecode left out."""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.name,
            "folder": str(self.folder),
            "files": len(self.files),
            "bytes": self.size,
            "tree_digest": self.tree_digest,
            "skipped": list(self.skipped),
        }


def variant_folders(path: Path) -> list[Path]:
    """The variant folders `path` names: `path/build/*`, `build/*` itself, or one variant."""
    if not path.exists():
        raise PublishError(f"{path} does not exist")
    if not path.is_dir():
        raise PublishError(
            f"{path} is not a folder",
            hint="give the kernel's repo folder (the one holding build/) or one build/<variant>",
        )
    build = path / BUILD_DIR
    if (path / METADATA_FILE).exists():
        return [path]
    if not build.is_dir() and path.name == BUILD_DIR:
        build = path
    if not build.is_dir():
        raise PublishError(
            f"{path} has no {BUILD_DIR}/ folder and is not a variant folder (it has no "
            f"{METADATA_FILE})",
            hint="build the kernel first (the kernel builder writes build/<variant>/...), then "
            "give the kernel's repo folder or one build/<variant> folder",
        )
    folders: list[Path] = []
    for entry in sorted(build.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            raise PublishError(
                f"{entry} is a symlink; a variant is a real folder (the store refuses links)",
                hint="replace the link with the folder it points at",
            )
        if entry.is_dir():
            folders.append(entry)
    if not folders:
        raise PublishError(
            f"{build} holds no variant folders",
            hint="build the kernel first: each build/<variant> folder is one variant",
        )
    return folders


def open_regular(path: Path) -> IO[bytes]:
    """Open a build file for reading: never through a symlink, never a fifo or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise PublishError(f"{path} is not a regular file")
    return fh


def _hash(path: Path, algorithm: str = "sha256") -> tuple[str, int]:
    h = hashlib.new(algorithm)
    n = 0
    with open_regular(path) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _walk(
    folder: Path, ctx: dict[str, str | None]
) -> tuple[list[tuple[str, Path, int]], list[str]]:
    """(relative path, file, tree mode) of every file to publish, and the bytecode left out.

    Names and file types go through the store's own checks: a symlink, fifo or device, or a
    name the store would refuse, is refused here with the store's message."""
    found: list[tuple[str, Path, int]] = []
    left_out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        for name in sorted(dirnames):
            full = here / name
            rel = full.relative_to(folder).as_posix()
            if skipped(rel):
                dirnames.remove(name)
                left_out.append(rel + "/")
            elif full.is_symlink():
                normalize_mode(full.lstat().st_mode, validate_relpath(rel, **ctx), **ctx)
        dirnames.sort()
        for name in sorted(filenames):
            full = here / name
            rel = full.relative_to(folder).as_posix()
            if skipped(rel):
                left_out.append(rel)
                continue
            validate_relpath(rel, **ctx)
            st_mode = full.lstat().st_mode
            # setuid/setgid/sticky bits are not part of a tree: only the type and rwx count
            mode = normalize_mode(stat.S_IFMT(st_mode) | (st_mode & 0o777), rel, **ctx)
            found.append((rel, full, mode))
    check_unique_paths((rel for rel, _p, _m in found), **ctx)
    return found, left_out


def check_variant(folder: Path, *, repo_id: str, commit: str | None = None) -> LocalVariant:
    """Hash and check one variant folder; PublishError (with the store's message) if anything
    would make the store refuse it: bad names or file types, no or malformed metadata.json, a
    digest that does not describe exactly the folder's files."""
    name = folder.name
    ctx: dict[str, str | None] = {"repo_id": repo_id, "commit": commit, "variant": name}
    try:
        validate_variant(name, repo_id=repo_id, commit=commit)
        found, left_out = _walk(folder, ctx)
        if not any(rel == METADATA_FILE for rel, _p, _m in found):
            raise PublishError(
                f"variant {name} ({folder}) has no {METADATA_FILE}",
                hint=f"every build/<variant> folder needs the {METADATA_FILE} the kernel builder "
                "writes (id, name, version, backend, digest): rebuild that variant, or remove "
                "the folder if it is not one",
            )
        files: list[LocalFile] = []
        for rel, path, mode in found:
            sha, size = _hash(path)
            files.append(LocalFile(rel, path, size, sha, mode))
        by_path = {f.path: ManifestEntry(f.path, f.mode, f.size, f.sha256) for f in files}
        sources = {f.path: f.source for f in files}
        with open_regular(sources[METADATA_FILE]) as fh:
            raw = fh.read(MAX_METADATA_BYTES + 1)
        doc, meta = parse_metadata(raw, **ctx)

        def hash_file(algorithm: str, path: str) -> bytes:
            return bytes.fromhex(_hash(sources[path], algorithm)[0])

        # The digest is mandatory here: it is the author's own statement of what the build is.
        check_metadata_digest(doc, by_path, hash_file, require=True, **ctx)
    except MetadataDigestError as exc:
        raise PublishError(str(exc)) from None  # its message says to re-run the hash step
    except MetadataError as exc:
        raise PublishError(
            str(exc), hint=f"{METADATA_FILE} is the kernel builder's: rebuild the variant"
        ) from None
    except StoreError as exc:
        raise PublishError(str(exc)) from None
    except OSError as exc:
        raise PublishError(f"cannot read {folder}: {exc.strerror or exc}") from None
    return LocalVariant(
        name=name,
        folder=folder,
        files=tuple(sorted(files, key=lambda f: f.path.encode())),
        metadata=meta,
        tree_digest=tree_digest(by_path.values()),
        skipped=tuple(left_out),
    )
