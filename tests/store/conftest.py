"""Fixtures and helpers for the store tests.

Runs as a normal conftest; it can also be loaded alone with
``pytest --noconftest -p tests.store.conftest tests/store``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.store import Store, TreeFile

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
REPO = "kernels-community/activation"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def metadata_for(
    files: dict[str, bytes],
    *,
    algorithm: str | None = "sha256",
    extra: dict[str, object] | None = None,
    kid: str = "_activation_0123abc",
) -> bytes:
    doc: dict[str, object] = {
        "id": kid,
        "name": "activation",
        "version": 1,
        "license": "apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda", "archs": ["8.0", "9.0a"]},
    }
    if algorithm is not None:
        doc["digest"] = {
            "algorithm": algorithm,
            "files": {
                p: base64.b64encode(hashlib.new(algorithm, b).digest()).decode()
                for p, b in files.items()
            },
        }
    doc.update(extra or {})
    return json.dumps(doc).encode()


def variant_files(seed: str = "x", n: int = 3, size: int = 100) -> dict[str, bytes]:
    files = {
        "__init__.py": f"from ._ops import ops  # {seed}\n".encode(),
        "_ops.py": f"ops = {seed!r}\n".encode(),
    }
    for i in range(n):
        files[f"_activation_cpu_{i}.abi3.so"] = (f"{seed}-{i}-".encode() * size)[: size * 4]
    return files


def ingest_variant(
    store: Store, files: dict[str, bytes], *, metadata: bytes | None = None, **meta_kw: object
) -> list[TreeFile]:
    """Ingest ``files`` plus a metadata.json that covers them; return the TreeFiles."""
    all_files = dict(files)
    if "metadata.json" not in all_files:
        all_files["metadata.json"] = (
            metadata if metadata is not None else metadata_for(files, **meta_kw)  # type: ignore[arg-type]
        )
    out = []
    for path, data in all_files.items():
        info = store.blobs.ingest(data, size=len(data), sha256=sha256(data))
        out.append(TreeFile(path, info.sha256, len(data), upstream_id=info.sha256))
    return out


def publish(
    store: Store,
    repo: str = REPO,
    commit: str = COMMIT_A,
    variant: str = "torch-cpu",
    files: dict[str, bytes] | None = None,
    **kw: object,
):
    tree_files = ingest_variant(store, files if files is not None else variant_files(), **kw)
    return store.trees.publish_tree(repo, commit, variant, tree_files)


def walk_all(root: Path) -> set[str]:
    out = set()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> Iterator[Store]:
    s = Store.open(store_root, min_age_s=0, orphan_grace_s=0)
    try:
        yield s
    finally:
        s.close()
