"""The build cache: its key, its manifest, and reading an entry back (verified) or dropping it.

An entry is `<cache_dir>/<key>/`, keyed by the kernels' sources, the build scripts (every module
of examples/kernels/), the toolchain and the platform; its manifest lists what the build
produced. A warm call reads the manifest and re-hashes the files, nothing more.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from examples.kernels.built import BuiltExamples, BuiltKernel, BuiltVariant
from examples.kernels.digest import iter_files, verify_variant
from examples.kernels.specs import HERE, KERNELS, KernelSpec
from examples.kernels.toolchain import toolchain_facts

REPO_ROOT = HERE.parents[1]
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "examples"
CACHE_ENV = "KERNELD_EXAMPLES_CACHE"
# Bump to invalidate every cached build when the cache layout changes.
CACHE_FORMAT = "2"
MANIFEST = "manifest.json"


def _feed(h: Any, label: str, data: bytes) -> None:
    """Length-prefixed so that no two different inputs hash alike."""
    h.update(f"{label}\0{len(data)}\0".encode())
    h.update(data)


def kernel_hash(spec: KernelSpec) -> str:
    """Hash of a kernel's sources and of the build scripts that shape its variants."""
    h = hashlib.sha256()
    for path in iter_files(spec.directory):
        _feed(h, path.relative_to(spec.directory).as_posix(), path.read_bytes())
    for script in sorted(HERE.glob("*.py")):  # build.py, _compile_ext.py and their helpers
        _feed(h, script.name, script.read_bytes())
    return h.hexdigest()


def cache_key(facts: Mapping[str, str] | None = None) -> str:
    """Key of the cache entry: sources + build scripts + toolchain + platform."""
    facts = toolchain_facts() if facts is None else facts
    h = hashlib.sha256()
    _feed(h, "format", CACHE_FORMAT.encode())
    for spec in KERNELS:
        _feed(h, f"kernel:{spec.name}", kernel_hash(spec).encode())
    for name in sorted(facts):
        _feed(h, f"fact:{name}", facts[name].encode())
    return h.hexdigest()[:16]


def build_id(spec: KernelSpec, version: int, variant: str, source_hash: str) -> str:
    """Metadata id, module name and op namespace of one build: `_<name>_<7 hex>`."""
    digest = hashlib.sha256(f"{source_hash}\0{version}\0{variant}".encode()).hexdigest()
    return f"_{spec.python_name}_{digest[:7]}"


def resolve_cache_dir(cache_dir: Path | str | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).resolve()
    env = os.environ.get(CACHE_ENV)
    return Path(env).resolve() if env else DEFAULT_CACHE_DIR


def prune(cache_dir: Path, keep: Path, max_entries: int = 4) -> None:
    """Drop the oldest cache entries beyond max_entries (each source edit makes a new one)."""
    entries = [p for p in cache_dir.iterdir() if p.is_dir() and (p / MANIFEST).is_file()]
    entries.sort(key=lambda p: (p / MANIFEST).stat().st_mtime, reverse=True)
    for old in [p for p in entries if p != keep][max_entries - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def to_manifest(built: BuiltExamples) -> dict[str, Any]:
    def rel(path: Path) -> str:
        return path.relative_to(built.root).as_posix()

    return {
        "format": CACHE_FORMAT,
        "cache_key": built.cache_key,
        "arch_variant": built.arch_variant,
        "org": built.org,
        "compile_seconds": dict(built.compile_seconds),
        "cold_build_seconds": built.cold_build_seconds,
        "kernels": [
            {
                "name": k.name,
                "version": k.version,
                "version_string": k.version_string,
                "path": rel(k.path),
                "lfs": k.lfs,
                "variants": [
                    {
                        "variant": v.variant,
                        "path": rel(v.path),
                        "module_id": v.module_id,
                        "compiled": v.compiled,
                        "library": v.library,
                        "library_sha256": v.library_sha256,
                        "ops": list(v.ops),
                        "files": list(v.files),
                        "layout": v.layout,
                    }
                    for v in k.variants
                ],
            }
            for k in built.kernels
        ],
    }


def load_cached_build(root: Path) -> BuiltExamples | None:
    """The cache entry at root, or None when it is missing, stale or damaged."""
    try:
        data = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if data.get("format") != CACHE_FORMAT or data.get("cache_key") != root.name:
        return None
    kernels = []
    for k in data["kernels"]:
        variants = []
        for v in k["variants"]:
            path = root / v["path"]
            if verify_variant(path):
                return None
            variants.append(
                BuiltVariant(
                    kernel=k["name"],
                    version=k["version"],
                    variant=v["variant"],
                    path=path,
                    module_id=v["module_id"],
                    compiled=v["compiled"],
                    library=v["library"],
                    library_sha256=v["library_sha256"],
                    ops=tuple(v["ops"]),
                    files=tuple(v["files"]),
                    layout=v["layout"],
                )
            )
        kernels.append(
            BuiltKernel(
                name=k["name"],
                version=k["version"],
                version_string=k["version_string"],
                path=root / k["path"],
                lfs=k["lfs"],
                variants=tuple(variants),
            )
        )
    return BuiltExamples(
        root=root,
        cache_key=data["cache_key"],
        arch_variant=data["arch_variant"],
        org=data["org"],
        kernels=tuple(kernels),
        compile_seconds=data["compile_seconds"],
        cold_build_seconds=data["cold_build_seconds"],
    )
