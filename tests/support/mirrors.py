"""Build small kerneld mirrors on disk from in-memory variants (for upstream-chain tests)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from kerneld.mirror.documents import Manifest, MirrorWriter
from kerneld.upstream.base import RemoteFile


def variant(
    ident: str,
    *,
    extra: Mapping[str, bytes] | None = None,
    depends: list[dict[str, object]] | None = None,
    backend: str = "cpu",
) -> dict[str, bytes]:
    """A minimal importable variant with a metadata.json whose digest covers every file."""
    files = {
        "__init__.py": f"NAME = {ident!r}\n".encode(),
        **(extra or {}),
    }
    digest = {
        p: base64.b64encode(hashlib.sha256(d).digest()).decode() for p, d in sorted(files.items())
    }
    meta: dict[str, object] = {
        "id": ident,
        "name": ident.strip("_").split("_")[0] or "k",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": backend},
        "digest": {"algorithm": "sha256", "files": digest},
    }
    if depends:
        meta["kernel-depends"] = depends
    files["metadata.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


def write_mirror(
    root: Path,
    repos: Mapping[str, Mapping[str, Mapping[str, Mapping[str, bytes]]]],
    *,
    branches: Mapping[str, Mapping[str, str]] | None = None,
) -> MirrorWriter:
    """repos: repo_id -> commit -> variant -> path -> bytes. branches: repo_id -> name -> commit."""
    writer = MirrorWriter(root, name="test-mirror")
    writer.write_info()
    for repo_id, commits in repos.items():
        for commit, variants in commits.items():
            manifest: dict[str, list[RemoteFile]] = {}
            for name, files in variants.items():
                entries = []
                for path, data in files.items():
                    sha = hashlib.sha256(data).hexdigest()
                    writer.write_blob(sha, data)
                    entries.append(RemoteFile(path, len(data), sha256=sha))
                manifest[name] = entries
            writer.write_manifest(Manifest(repo_id, commit, manifest))
        writer.write_refs(repo_id, (branches or {}).get(repo_id, {}), {})
    return writer
