"""Build the example kernels into Hub layout and lay them out as Hub-style git repos.

kerneld's tests need real kernels: a native `.abi3.so` that registers ops, noarch variants, two
versions, LFS-stored binaries, all in the Kernel Hub format that `kernels` loads. Compiling one
takes seconds, so builds are cached under a key that hashes the sources, the build scripts,
torch, the compiler and the platform; a warm call only reads a manifest and re-hashes the files.

    .venv/bin/python -m examples.kernels.build --out DIR [--bare]

Python API (used by tests/fixtures_examples.py): `build_examples()`, `make_hub()`,
`make_hub_root()`, `check_reproducible()` here; what they return is in `built.py` (the build)
and `hub.py` (the repos), the kernels themselves in `specs.py`. The steps live beside them:
`toolchain.py` compiles, `variant_files.py` writes a variant folder, `digest.py` hashes it and
`cache.py` keys, records and reads back a build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from filelock import FileLock

from examples.kernels.built import BuiltExamples, BuiltKernel, BuiltVariant
from examples.kernels.cache import (
    CACHE_ENV,
    MANIFEST,
    build_id,
    cache_key,
    kernel_hash,
    load_cached_build,
    prune,
    resolve_cache_dir,
    to_manifest,
)
from examples.kernels.hub import HubRoot, lay_out_hub
from examples.kernels.specs import KERNELS, ORG, VERSIONS, BuildError
from examples.kernels.toolchain import (
    CompileJob,
    cxx_compiler,
    local_arch_variant,
    run_compile_jobs,
    toolchain_facts,
)
from examples.kernels.variant_files import write_variant

REPRO_RESULT = "repro-check.json"


@dataclass(frozen=True)
class ReproCheck:
    """Result of rebuilding one native library in another directory and comparing bytes."""

    library: str
    cached_sha256: str
    rebuilt_sha256: str
    rebuild_seconds: float
    checked_at_key: str = field(default="")

    @property
    def reproducible(self) -> bool:
        return self.cached_sha256 == self.rebuilt_sha256


def _build(cache_dir: Path, key: str, workers: int | None) -> BuiltExamples:
    started = time.monotonic()
    facts = toolchain_facts()
    arch = local_arch_variant()
    archs = {fmt: local_arch_variant(fmt) for fmt in {spec.name_format for spec in KERNELS}}
    work = cache_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    source_hashes = {spec.name: kernel_hash(spec) for spec in KERNELS}

    jobs = [
        CompileJob(
            name=(ns := build_id(spec, version, archs[spec.name_format], source_hashes[spec.name])),
            spec=spec,
            version=version,
            stage=work / ns,
        )
        for spec in KERNELS
        if spec.sources
        for version in VERSIONS
    ]
    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    compile_seconds = run_compile_jobs(jobs, n_workers, facts["compiler"], work)

    partial = cache_dir / f"{key}.partial-{os.getpid()}"
    for stale in cache_dir.glob("*.partial-*"):  # left by a crashed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    kernels: list[BuiltKernel] = []
    for spec in KERNELS:
        for version in VERSIONS:
            kernel_root = partial / spec.name / f"v{version}"
            variants: list[BuiltVariant] = []
            if spec.sources:
                name = archs[spec.name_format]
                ns = build_id(spec, version, name, source_hashes[spec.name])
                library = work / ns / "lib" / f"{ns}.abi3.so"
                if not library.is_file():
                    raise BuildError(f"the compiler produced no {library.name}")
                variants.append(
                    write_variant(
                        kernel_root / "build" / name,
                        spec=spec,
                        version=version,
                        variant=name,
                        namespace=ns,
                        library=library,
                    )
                )
            for variant in spec.noarch:
                ns = build_id(spec, version, variant, source_hashes[spec.name])
                variants.append(
                    write_variant(
                        kernel_root / "build" / variant,
                        spec=spec,
                        version=version,
                        variant=variant,
                        namespace=ns,
                        library=None,
                    )
                )
            kernels.append(
                BuiltKernel(
                    name=spec.name,
                    version=version,
                    version_string=f"{version}.0.0",
                    path=kernel_root,
                    lfs=spec.lfs,
                    variants=tuple(variants),
                )
            )

    built = BuiltExamples(
        root=partial,
        cache_key=key,
        arch_variant=arch,
        org=ORG,
        kernels=tuple(kernels),
        compile_seconds=compile_seconds,
        cold_build_seconds=round(time.monotonic() - started, 3),
    )
    (partial / MANIFEST).write_text(json.dumps(to_manifest(built), indent=2) + "\n")
    final = cache_dir / key
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    shutil.rmtree(work, ignore_errors=True)
    prune(cache_dir, keep=final)
    loaded = load_cached_build(final)
    assert loaded is not None
    return loaded


def build_examples(
    cache_dir: Path | str | None = None, *, force: bool = False, workers: int | None = None
) -> BuiltExamples:
    """Build every kernel, version and variant for the local torch, or reuse the cached build.

    cache_dir defaults to $KERNELD_EXAMPLES_CACHE, else .cache/examples at the repo root; the
    entry is `<cache_dir>/<key>/`. A file lock keeps concurrent callers from building twice.
    """
    started = time.monotonic()
    cache = resolve_cache_dir(cache_dir)
    key = cache_key()
    if not force and (hit := load_cached_build(cache / key)) is not None:
        return replace(hit, cache_hit=True, seconds=time.monotonic() - started)
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / ".lock")):
        if not force and (hit := load_cached_build(cache / key)) is not None:
            return replace(hit, cache_hit=True, seconds=time.monotonic() - started)
        built = _build(cache, key, workers)
    return replace(built, cache_hit=False, seconds=time.monotonic() - started)


def check_reproducible(built: BuiltExamples, kernel: str = "relu2", version: int = 1) -> ReproCheck:
    """Rebuild one native library in a different directory and compare it with the cached one.

    The result is stored next to the cache entry, so only the first call pays for the compile.
    """
    result_file = built.root / REPRO_RESULT
    variant = built.variant(kernel, version)
    if variant.library is None or variant.library_sha256 is None:
        raise ValueError(f"{kernel} v{version} has no native library")
    try:
        data = json.loads(result_file.read_text())
        if data.get("library") == variant.library:
            return ReproCheck(**data)
    except (OSError, ValueError, TypeError):
        pass
    spec = next(s for s in KERNELS if s.name == kernel)
    cache_dir = built.root.parent
    with FileLock(str(cache_dir / ".lock")):
        work = cache_dir / "work-repro" / "a" / "different" / "place"
        work.mkdir(parents=True, exist_ok=True)
        job = CompileJob(name=variant.module_id, spec=spec, version=version, stage=work / "x")
        started = time.monotonic()
        run_compile_jobs([job], 1, cxx_compiler(), work)
        seconds = time.monotonic() - started
        rebuilt = job.stage / "lib" / variant.library
        check = ReproCheck(
            library=variant.library,
            cached_sha256=variant.library_sha256,
            rebuilt_sha256=hashlib.sha256(rebuilt.read_bytes()).hexdigest(),
            rebuild_seconds=round(seconds, 3),
            checked_at_key=built.cache_key,
        )
        result_file.write_text(json.dumps(check.__dict__, indent=2) + "\n")
        shutil.rmtree(cache_dir / "work-repro", ignore_errors=True)
    return check


def make_hub(
    dest: Path | str,
    *,
    bare: bool = False,
    built: BuiltExamples | None = None,
    cache_dir: Path | str | None = None,
) -> HubRoot:
    """Lay every kernel out as a git repo at `<dest>/kernels/<org>/<name>`.

    Branches main, v1, v2 and tags v1.0.0, v2.0.0; `.so` files of LFS kernels are stored as LFS
    pointers with their objects under `<git dir>/lfs/objects`. Existing repos there are replaced.
    The repos are created once per build (fixed dates and authors make them reproducible) and
    copied from there, so each call costs a file copy.
    """
    built = build_examples(cache_dir) if built is None else built
    return lay_out_hub(dest, bare=bare, built=built)


def make_hub_root(
    dest: Path | str,
    *,
    bare: bool = False,
    built: BuiltExamples | None = None,
    cache_dir: Path | str | None = None,
) -> Path:
    """Like make_hub, returning only the root (repos are at `<root>/kernels/<org>/<name>`)."""
    return make_hub(dest, bare=bare, built=built, cache_dir=cache_dir).root


# --------------------------------------------------------------------------- CLI


def _summary(built: BuiltExamples, hub: HubRoot | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cache_key": built.cache_key,
        "cache_dir": str(built.root),
        "cache_hit": built.cache_hit,
        "seconds": round(built.seconds, 3),
        "cold_build_seconds": built.cold_build_seconds,
        "compile_seconds": dict(built.compile_seconds),
        "arch_variant": built.arch_variant,
        "kernels": {
            f"{k.name}@v{k.version}": {v.variant: v.module_id for v in k.variants}
            for k in built.kernels
        },
    }
    if hub is not None:
        out["hub_root"] = str(hub.root)
        out["repos"] = {
            r.repo_id: {"path": str(r.path), "bare": r.bare, "branches": dict(r.branches)}
            for r in hub.repos
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, help="lay the kernels out as git repos under DIR")
    parser.add_argument("--bare", action="store_true", help="bare git repos instead of work trees")
    parser.add_argument("--cache-dir", type=Path, help=f"default: ${CACHE_ENV} or .cache/examples")
    parser.add_argument("--force", action="store_true", help="rebuild even on a cache hit")
    parser.add_argument("--workers", type=int, help="parallel compiler processes (default: CPUs)")
    parser.add_argument(
        "--check-repro", action="store_true", help="rebuild one library elsewhere, compare bytes"
    )
    args = parser.parse_args(argv)
    built = build_examples(args.cache_dir, force=args.force, workers=args.workers)
    hub = make_hub(args.out, bare=args.bare, built=built) if args.out else None
    summary = _summary(built, hub)
    if args.check_repro:
        check = check_reproducible(built)
        summary["repro"] = {**check.__dict__, "reproducible": check.reproducible}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
