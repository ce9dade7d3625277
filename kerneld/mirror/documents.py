"""The kerneld mirror layout, version 1: static files any web server or object store can serve.

    <mirror>/
      mirror-info                                  {"format": "kerneld-mirror", "version": 1, ...}
      refs/<org>/<name>.json                       {"repo_id", "branches": {..}, "tags": {..}}
      manifests/<org>/<name>/<commit>.json         one commit: its exported variants and files
      manifests/<org>/<name>/<commit>.json.sig     detached signatures (format: kerneld.mirror.keys)
      refs/<org>/<name>.json.sig                   signatures of the refs (no silent ref rollback)
      blobs/sha256/<2 hex>/<64 hex>                file contents by sha256

A manifest:

    {"repo_id": "org/name", "commit": "<40 hex>",
     "variants": {"<variant>": {"files": [{"path": "metadata.json", "size": 123,
                                           "sha256": "<64 hex>", "git_sha1": "<40 hex>"|null}]}}}

Every file carries its sha256 (the store's address); `git_sha1` is kept when the file was a plain
git file upstream (null for LFS files, whose id is the sha256), so lock-file hashes of the old
format can still be checked offline. An executable file carries `"mode": "0755"` (absent: 0644),
so a tree keeps its digest through an export and an import. Refs documents may carry
`"exported_at"` (Unix time), which an import uses to never roll a ref back. Readers ignore keys
they do not know. Readers treat everything as untrusted: names are validated here, and content is
verified by the store on ingest.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kerneld.upstream.base import RemoteFile, check_repo_id
from kerneld_client.vocabulary import is_commit, is_hex

FORMAT = "kerneld-mirror"
VERSION = 1
INFO = "mirror-info"


class MirrorFormatError(ValueError):
    """A mirror file is malformed or of an unknown version."""


def refs_path(repo_id: str) -> str:
    return f"refs/{check_repo_id(repo_id)}.json"


def manifest_path(repo_id: str, commit: str) -> str:
    if not is_commit(commit):
        raise MirrorFormatError(f"not a 40-hex commit: {commit!r}")
    return f"manifests/{check_repo_id(repo_id)}/{commit}.json"


def blob_path(sha256: str) -> str:
    if not is_hex(sha256, 64):
        raise MirrorFormatError(f"not a sha256 hex digest: {sha256!r}")
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


EXEC_MODE = "0755"


@dataclass(frozen=True)
class Manifest:
    repo_id: str
    commit: str
    variants: dict[str, list[RemoteFile]] = field(default_factory=dict)
    executables: dict[str, frozenset[str]] = field(default_factory=dict)
    """variant -> paths of executable files (most variants have none)."""
    verdicts: dict[str, Any] | None = None
    """The exporting site's publisher and provenance verdicts (`kerneld.mirror.verdicts`);
    None in a manifest of an older kerneld."""

    def is_executable(self, variant: str, path: str) -> bool:
        return path in self.executables.get(variant, frozenset())

    def _entry(self, variant: str, f: RemoteFile) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "path": f.path,
            "size": f.size,
            "sha256": f.sha256,
            "git_sha1": f.git_sha1,
        }
        if self.is_executable(variant, f.path):
            entry["mode"] = EXEC_MODE
        return entry

    def to_json(self) -> bytes:
        doc = {
            "repo_id": self.repo_id,
            "commit": self.commit,
            "variants": {
                name: {"files": [self._entry(name, f) for f in sorted(files, key=lambda f: f.path)]}
                for name, files in sorted(self.variants.items())
            },
        }
        if self.verdicts is not None:
            doc["verdicts"] = self.verdicts
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes, *, repo_id: str, commit: str) -> Manifest:
        doc = _load(data, "manifest")
        if doc.get("repo_id") != repo_id or doc.get("commit") != commit:
            raise MirrorFormatError(
                f"manifest names {doc.get('repo_id')}@{doc.get('commit')}, "
                f"expected {repo_id}@{commit}"
            )
        variants: dict[str, list[RemoteFile]] = {}
        executables: dict[str, frozenset[str]] = {}
        raw_variants = doc.get("variants")
        if not isinstance(raw_variants, dict):
            raise MirrorFormatError("manifest 'variants' must be an object")
        for name, body in raw_variants.items():
            if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
                raise MirrorFormatError(f"bad variant name {name!r}")
            files = body.get("files") if isinstance(body, dict) else None
            if not isinstance(files, list):
                raise MirrorFormatError(f"variant {name!r}: 'files' must be a list")
            variants[name] = [_file(entry, name) for entry in files]
            execs = frozenset(e["path"] for e in files if _executable(e, name))
            if execs:
                executables[name] = execs
        verdicts = doc.get("verdicts")
        if verdicts is not None and not isinstance(verdicts, dict):
            raise MirrorFormatError("manifest 'verdicts' must be an object")
        return cls(
            repo_id=repo_id,
            commit=commit,
            variants=variants,
            executables=executables,
            verdicts=verdicts,
        )


def _executable(entry: dict[str, Any], variant: str) -> bool:
    mode = entry.get("mode")
    if mode is None or mode == "0644":
        return False
    if mode == EXEC_MODE:
        return True
    raise MirrorFormatError(f"variant {variant!r}: bad mode {mode!r} for {entry.get('path')!r}")


def _file(entry: Any, variant: str) -> RemoteFile:
    if not isinstance(entry, dict):
        raise MirrorFormatError(f"variant {variant!r}: file entries must be objects")
    path, size, sha256 = entry.get("path"), entry.get("size"), entry.get("sha256")
    git_sha1 = entry.get("git_sha1")
    if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool):
        raise MirrorFormatError(f"variant {variant!r}: bad file entry {entry!r}")
    if size < 0 or not isinstance(sha256, str) or not is_hex(sha256, 64):
        raise MirrorFormatError(f"variant {variant!r}: bad size or sha256 for {path!r}")
    if git_sha1 is not None and not (isinstance(git_sha1, str) and is_commit(git_sha1)):
        raise MirrorFormatError(f"variant {variant!r}: bad git_sha1 for {path!r}")
    return RemoteFile(path=path, size=size, sha256=sha256, git_sha1=git_sha1)


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:  # also bad UTF-8, and numbers longer than int() converts
        raise MirrorFormatError(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise MirrorFormatError(f"{what} is not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise MirrorFormatError(f"{what} must be a JSON object")
    return doc


def parse_info(data: bytes) -> dict[str, Any]:
    doc = _load(data, INFO)
    if doc.get("format") != FORMAT:
        raise MirrorFormatError(f"{INFO}: format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise MirrorFormatError(
            f"{INFO}: mirror format version {doc.get('version')!r} is not supported "
            f"(this kerneld reads version {VERSION}); upgrade kerneld or re-export the mirror"
        )
    return doc


def parse_refs(data: bytes, repo_id: str) -> tuple[dict[str, str], dict[str, str]]:
    doc = _load(data, f"refs of {repo_id}")
    out: list[dict[str, str]] = []
    for key in ("branches", "tags"):
        table = doc.get(key, {})
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and is_commit(v) for k, v in table.items()
        ):
            raise MirrorFormatError(f"refs of {repo_id}: {key!r} must map names to commits")
        out.append(dict(table))
    return out[0], out[1]


class MirrorWriter:
    """Writes a mirror directory with atomic file replacement (readers never see partial files)."""

    def __init__(self, root: Path, *, name: str = "") -> None:
        self.root = root
        self.name = name

    def _write(self, rel: str, data: bytes) -> None:
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def write_info(self) -> None:
        self._write(INFO, info_json(self.name))

    def write_refs(
        self,
        repo_id: str,
        branches: Mapping[str, str],
        tags: Mapping[str, str],
        *,
        exported_at: float | None = None,
    ) -> bytes:
        self._write(refs_path(repo_id), data := refs_json(repo_id, branches, tags, exported_at))
        return data

    def write_manifest(self, manifest: Manifest) -> bytes:
        data = manifest.to_json()
        self._write(manifest_path(manifest.repo_id, manifest.commit), data)
        return data

    def write_file(self, rel: str, data: bytes) -> None:
        """Write any mirror file (signatures) atomically."""
        self._write(rel, data)

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        path = self.root / blob_path(sha256)
        try:
            st = path.lstat()
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)

    def write_blob(self, sha256: str, data: bytes) -> None:
        if not self.has_blob(sha256):
            self._write(blob_path(sha256), data)


def info_json(name: str = "") -> bytes:
    """The bytes of a new mirror's `mirror-info`."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def refs_json(
    repo_id: str,
    branches: Mapping[str, str],
    tags: Mapping[str, str],
    exported_at: float | None = None,
) -> bytes:
    doc: dict[str, Any] = {"repo_id": repo_id, "branches": dict(branches), "tags": dict(tags)}
    if exported_at is not None:
        doc["exported_at"] = exported_at
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def parse_refs_exported_at(data: bytes) -> float | None:
    """The `exported_at` of a refs document, if any (callers parsed it with parse_refs first)."""
    value = _load(data, "refs").get("exported_at")
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None
