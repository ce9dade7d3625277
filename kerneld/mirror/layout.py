"""The kerneld mirror layout, version 1: static files any web server or object store can serve.

    <mirror>/
      mirror-info                                  {"format": "kerneld-mirror", "version": 1, ...}
      refs/<org>/<name>.json                       {"repo_id", "branches": {..}, "tags": {..}}
      manifests/<org>/<name>/<commit>.json         one commit: its exported variants and files
      manifests/<org>/<name>/<commit>.json.sig     detached signatures (written by export, issue 8)
      blobs/sha256/<2 hex>/<64 hex>                file contents by sha256

A manifest:

    {"repo_id": "org/name", "commit": "<40 hex>",
     "variants": {"<variant>": {"files": [{"path": "metadata.json", "size": 123,
                                           "sha256": "<64 hex>", "git_sha1": "<40 hex>"|null}]}}}

Every file carries its sha256 (the store's address); `git_sha1` is kept when known so lock-file
hashes of the old format can still be checked offline. Readers treat everything as untrusted:
names are validated here, and content is verified by the store on ingest.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kerneld.upstream.base import SHA256_RE, RemoteFile, check_repo_id, is_commit

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
    if not SHA256_RE.match(sha256):
        raise MirrorFormatError(f"not a sha256 hex digest: {sha256!r}")
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


@dataclass(frozen=True)
class Manifest:
    repo_id: str
    commit: str
    variants: dict[str, list[RemoteFile]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "repo_id": self.repo_id,
            "commit": self.commit,
            "variants": {
                name: {
                    "files": [
                        {"path": f.path, "size": f.size, "sha256": f.sha256, "git_sha1": f.git_sha1}
                        for f in sorted(files, key=lambda f: f.path)
                    ]
                }
                for name, files in sorted(self.variants.items())
            },
        }
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
        return cls(repo_id=repo_id, commit=commit, variants=variants)


def _file(entry: Any, variant: str) -> RemoteFile:
    if not isinstance(entry, dict):
        raise MirrorFormatError(f"variant {variant!r}: file entries must be objects")
    path, size, sha256 = entry.get("path"), entry.get("size"), entry.get("sha256")
    git_sha1 = entry.get("git_sha1")
    if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool):
        raise MirrorFormatError(f"variant {variant!r}: bad file entry {entry!r}")
    if size < 0 or not isinstance(sha256, str) or not SHA256_RE.match(sha256):
        raise MirrorFormatError(f"variant {variant!r}: bad size or sha256 for {path!r}")
    if git_sha1 is not None and not (isinstance(git_sha1, str) and is_commit(git_sha1)):
        raise MirrorFormatError(f"variant {variant!r}: bad git_sha1 for {path!r}")
    return RemoteFile(path=path, size=size, sha256=sha256, git_sha1=git_sha1)


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MirrorFormatError(f"{what} is not valid JSON: {exc}") from exc
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
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        self._write(INFO, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")

    def write_refs(
        self, repo_id: str, branches: Mapping[str, str], tags: Mapping[str, str]
    ) -> None:
        doc = {"repo_id": repo_id, "branches": dict(branches), "tags": dict(tags)}
        self._write(refs_path(repo_id), json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")

    def write_manifest(self, manifest: Manifest) -> None:
        self._write(manifest_path(manifest.repo_id, manifest.commit), manifest.to_json())

    def has_blob(self, sha256: str) -> bool:
        return (self.root / blob_path(sha256)).is_file()

    def write_blob(self, sha256: str, data: bytes) -> None:
        if not self.has_blob(sha256):
            self._write(blob_path(sha256), data)
