"""The files of a variant folder, walked in a stable order, and the digest `kernels` checks.

metadata.json's `digest.files` is what `kernels` verifies before it imports a build; the cache
verifies every variant against it on each read, so a changed file invalidates the entry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}
_DIGEST_EXCLUDED = {"metadata.json", "metadata.json.sigstore"}


def iter_files(root: Path) -> Iterator[Path]:
    """Files under root in a stable order, without bytecode."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if Path(name).suffix not in _SKIP_SUFFIXES:
                yield Path(dirpath) / name


def variant_digest(variant_dir: Path) -> dict[str, str]:
    """metadata.json `digest.files`: base64(sha256) of every file but metadata.json(.sigstore).

    Bytecode is skipped, like `kernels` does, because importing a variant writes __pycache__.
    """
    files: dict[str, str] = {}
    for path in iter_files(variant_dir):
        rel = path.relative_to(variant_dir).as_posix()
        if rel in _DIGEST_EXCLUDED:
            continue
        files[rel] = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    return files


def verify_variant(variant_dir: Path) -> list[str]:
    """Differences between a variant's files and its metadata digest; empty when it matches."""
    try:
        metadata = json.loads((variant_dir / "metadata.json").read_text())
        expected: dict[str, str] = metadata["digest"]["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"metadata.json unreadable: {e}"]
    actual = variant_digest(variant_dir)
    problems = [f"missing {p}" for p in sorted(expected.keys() - actual.keys())]
    problems += [f"unexpected {p}" for p in sorted(actual.keys() - expected.keys())]
    problems += [
        f"hash mismatch {p}"
        for p in sorted(expected.keys() & actual.keys())
        if expected[p] != actual[p]
    ]
    return problems
