"""Build the example kernels into Hub layout and lay them out as Hub-style git repos.

kerneld's tests need real kernels: a native `.abi3.so` that registers ops, noarch variants, two
versions, LFS-stored binaries, all in the Kernel Hub format that `kernels` loads. Compiling one
takes seconds, so builds are cached under a key that hashes the sources, this script, torch,
the compiler and the platform; a warm call only reads a manifest and re-hashes the files.

    .venv/bin/python -m examples.kernels.build --out DIR [--bare]

Python API (used by tests/fixtures_examples.py): `build_examples()`, `make_hub()`,
`make_hub_root()`, `check_reproducible()`, `local_arch_variant()`, `variant_digest()`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from filelock import FileLock

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "examples"
CACHE_ENV = "KERNELD_EXAMPLES_CACHE"
ORG = "kerneld-examples"
VERSIONS = (1, 2)
LICENSE = "Apache-2.0"
KERNELS_MINVER = "0.17.0"
# Bump to invalidate every cached build when the cache layout changes.
CACHE_FORMAT = "1"
MANIFEST = "manifest.json"
REPRO_RESULT = "repro-check.json"
COMPILE_SCRIPT = HERE / "_compile_ext.py"
# Noarch variants register their ops for this dispatch key: CPU-only vs any device.
NOARCH_DISPATCH_KEYS = {"torch-cpu": "CPU", "torch-universal": "CompositeExplicitAutograd"}
# Fixed commit identity and dates, so the same build gives the same commit shas anywhere.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "kerneld examples",
    "GIT_AUTHOR_EMAIL": "examples@kerneld.invalid",
    "GIT_COMMITTER_NAME": "kerneld examples",
    "GIT_COMMITTER_EMAIL": "examples@kerneld.invalid",
}
COMMIT_DATES = {
    "v1": "2026-01-01T00:00:00+00:00",
    "v2": "2026-01-02T00:00:00+00:00",
    "main": "2026-01-03T00:00:00+00:00",
}
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}
_DIGEST_EXCLUDED = {"metadata.json", "metadata.json.sigstore"}


class BuildError(RuntimeError):
    """A compile or git step failed; the message carries the tool's output."""


@dataclass(frozen=True)
class KernelSpec:
    """One example kernel: its sources live in examples/kernels/<name>/."""

    name: str
    summary: str
    sources: tuple[str, ...]  # C++ sources relative to the kernel folder
    ops: Mapping[int, tuple[str, ...]]  # op names per kernel version
    noarch: tuple[str, ...] = ()  # noarch variants (need a torch-noarch/ overlay)
    lfs: bool = False  # store the native library through git LFS in the Hub repo

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def directory(self) -> Path:
        return HERE / self.name


KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec(
        name="activation",
        summary="Activations (SiLU, GELU; plain and gated) and RMSNorm, CPU ops plus a "
        "pure-PyTorch variant",
        sources=("csrc/activation.cpp",),
        ops={
            1: ("silu_and_mul", "gelu_tanh_and_mul", "rms_norm", "silu", "gelu_tanh"),
            2: (
                "silu_and_mul",
                "gelu_tanh_and_mul",
                "rms_norm",
                "silu",
                "gelu_tanh",
                "gelu_and_mul",
            ),
        },
        noarch=("torch-cpu", "torch-universal"),
        lfs=True,
    ),
    KernelSpec(
        name="relu2",
        summary="Squared ReLU, a small second kernel with its own op namespace",
        sources=("csrc/relu2.cpp",),
        ops={1: ("relu2",), 2: ("relu2", "relu2_and_mul")},
    ),
    KernelSpec(
        name="rotary",
        summary="Rotary position embedding, a function kernel (Transformers' rotary_pos_emb)",
        sources=("csrc/rotary.cpp",),
        ops={1: ("apply_rotary",), 2: ("apply_rotary",)},
    ),
)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class BuiltVariant:
    """One build variant folder, e.g. build/torch213-cxx11-cpu-x86_64-linux."""

    kernel: str
    version: int
    variant: str
    path: Path
    module_id: str  # metadata.json `id`: module name and op namespace
    compiled: bool
    library: str | None  # file name of the native extension, if compiled
    library_sha256: str | None
    ops: tuple[str, ...]
    files: tuple[str, ...]  # every file, relative to `path`, metadata.json included

    @property
    def namespace(self) -> str:
        return self.module_id

    @property
    def init_file(self) -> Path:
        return self.path / "__init__.py"

    @property
    def metadata_file(self) -> Path:
        return self.path / "metadata.json"


@dataclass(frozen=True)
class BuiltKernel:
    """One version of one kernel: `path` is a repo root holding `build/<variant>/`."""

    name: str
    version: int
    version_string: str  # the package's __version__
    path: Path
    lfs: bool
    variants: tuple[BuiltVariant, ...]

    @property
    def repo_id(self) -> str:
        return f"{ORG}/{self.name}"

    def variant(self, name: str) -> BuiltVariant:
        for v in self.variants:
            if v.variant == name:
                return v
        raise KeyError(f"{self.name} v{self.version} has no variant {name!r}")


@dataclass(frozen=True)
class BuiltExamples:
    """Everything one build produced, read back from the cache manifest."""

    root: Path
    cache_key: str
    arch_variant: str  # the local torch arch variant name
    org: str
    kernels: tuple[BuiltKernel, ...]
    compile_seconds: Mapping[str, float]  # per native extension, from the cold build
    cold_build_seconds: float  # wall time of the cold build that filled this cache entry
    cache_hit: bool = False
    seconds: float = 0.0  # wall time of this call

    def kernel(self, name: str, version: int = 1) -> BuiltKernel:
        for k in self.kernels:
            if k.name == name and k.version == version:
                return k
        raise KeyError(f"no built kernel {name!r} v{version}")

    def variant(self, name: str, version: int = 1, variant: str | None = None) -> BuiltVariant:
        """The given variant; by default the arch variant, else the kernel's first one."""
        kernel = self.kernel(name, version)
        if variant is not None:
            return kernel.variant(variant)
        for v in kernel.variants:
            if v.variant == self.arch_variant:
                return v
        return kernel.variants[0]

    def all_variants(self) -> Iterator[BuiltVariant]:
        for k in self.kernels:
            yield from k.variants

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k.name for k in self.kernels))


@dataclass(frozen=True)
class HubRepo:
    """One kernel laid out as a git repo at `<root>/kernels/<org>/<name>`."""

    repo_id: str
    name: str
    path: Path  # the work tree (non-bare) or the git dir (bare)
    bare: bool
    lfs: bool
    branches: Mapping[str, str]  # branch -> commit sha
    tags: Mapping[str, str]  # tag -> commit sha (tags are lightweight)
    branch_versions: Mapping[str, int]  # branch -> kernel version it carries
    lfs_paths: tuple[str, ...]  # repo paths stored as LFS pointers
    default_branch: str = "main"

    @property
    def git_dir(self) -> Path:
        return self.path if self.bare else self.path / ".git"

    @property
    def lfs_objects_dir(self) -> Path:
        return self.git_dir / "lfs" / "objects"


@dataclass(frozen=True)
class HubRoot:
    """A folder of Hub-style kernel repos, laid out as olah's mirrors-path expects."""

    root: Path
    org: str
    bare: bool
    repos: tuple[HubRepo, ...]

    def repo(self, name: str) -> HubRepo:
        for r in self.repos:
            if name in (r.name, r.repo_id):
                return r
        raise KeyError(f"no repo {name!r}")


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


# --------------------------------------------------------------------------- platform facts


def _compiler() -> str:
    return os.environ.get("CXX") or "g++"


def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")  # does not import torch
    if spec is None or spec.origin is None:
        raise BuildError("torch is not installed in this environment")
    return Path(spec.origin).parent


def toolchain_facts() -> dict[str, str]:
    """What the built bytes depend on besides the sources, found without importing torch."""
    torch_dir = _torch_dir()
    version_py = (torch_dir / "version.py").read_text()
    git = re.search(r"^git_version\s*=\s*['\"]([^'\"]*)['\"]", version_py, re.MULTILINE)
    compiler = _compiler()
    try:
        cc_version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"cannot run the C++ compiler {compiler!r}: {e}") from e
    return {
        "torch": importlib.metadata.version("torch"),
        "torch_git": git.group(1) if git else "",
        "compiler": compiler,
        "compiler_version": cc_version,
        "setuptools": importlib.metadata.version("setuptools"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "machine": platform.machine(),
        "system": platform.system(),
    }


def local_arch_variant() -> str:
    """The torch arch variant name of a CPU build for this machine, as `kernels` spells it.

    `torch<major><minor>[-cxx11|-cxx98]-cpu-<cpu>-<os>`: the ABI tag only on Linux. The backend
    is always `cpu` because the example ops are CPU code, whatever backend torch was built for.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    system = platform.system().lower()
    cpu = platform.machine()
    if system == "darwin" and cpu == "arm64":
        cpu = "aarch64"
    elif system == "windows" and cpu == "AMD64":
        cpu = "x86_64"
    abi = ""
    if system == "linux":
        abi = "-cxx11" if torch.compiled_with_cxx11_abi() else "-cxx98"
    if system in ("linux", "darwin", "windows") and len(major) == 1:
        return f"torch{major}{minor}{abi}-cpu-{cpu}-{system}"
    raise BuildError(f"cannot name a variant for torch {torch.__version__} on {system}")


# --------------------------------------------------------------------------- hashing


def _iter_files(root: Path) -> Iterator[Path]:
    """Files under root in a stable order, without bytecode."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if Path(name).suffix not in _SKIP_SUFFIXES:
                yield Path(dirpath) / name


def _feed(h: Any, label: str, data: bytes) -> None:
    """Length-prefixed so that no two different inputs hash alike."""
    h.update(f"{label}\0{len(data)}\0".encode())
    h.update(data)


def _source_hash(spec: KernelSpec) -> str:
    """Hash of a kernel's sources and of the build scripts that shape its variants."""
    h = hashlib.sha256()
    for path in _iter_files(spec.directory):
        _feed(h, path.relative_to(spec.directory).as_posix(), path.read_bytes())
    _feed(h, "build.py", Path(__file__).read_bytes())
    _feed(h, "_compile_ext.py", COMPILE_SCRIPT.read_bytes())
    return h.hexdigest()


def cache_key(facts: Mapping[str, str] | None = None) -> str:
    """Key of the cache entry: sources + build scripts + toolchain + platform."""
    facts = toolchain_facts() if facts is None else facts
    h = hashlib.sha256()
    _feed(h, "format", CACHE_FORMAT.encode())
    for spec in KERNELS:
        _feed(h, f"kernel:{spec.name}", _source_hash(spec).encode())
    for name in sorted(facts):
        _feed(h, f"fact:{name}", facts[name].encode())
    return h.hexdigest()[:16]


def build_id(spec: KernelSpec, version: int, variant: str, source_hash: str) -> str:
    """Metadata id, module name and op namespace of one build: `_<name>_<7 hex>`."""
    digest = hashlib.sha256(f"{source_hash}\0{version}\0{variant}".encode()).hexdigest()
    return f"_{spec.python_name}_{digest[:7]}"


def variant_digest(variant_dir: Path) -> dict[str, str]:
    """metadata.json `digest.files`: base64(sha256) of every file but metadata.json(.sigstore).

    Bytecode is skipped, like `kernels` does, because importing a variant writes __pycache__.
    """
    files: dict[str, str] = {}
    for path in _iter_files(variant_dir):
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


# --------------------------------------------------------------------------- the build


@dataclass(frozen=True)
class _CompileJob:
    name: str  # extension name == op namespace
    spec: KernelSpec
    version: int
    stage: Path


def resolve_cache_dir(cache_dir: Path | str | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).resolve()
    env = os.environ.get(CACHE_ENV)
    return Path(env).resolve() if env else DEFAULT_CACHE_DIR


def _compile_flags(stage: Path, torch_dir: Path) -> list[str]:
    """Flags that make the library small and independent of where it was built.

    __FILE__ of our sources and of torch's headers (TORCH_CHECK messages, TORCH_LIBRARY's
    registration site) would otherwise embed the build and venv paths.
    """
    include = Path(sysconfig.get_paths()["include"])
    return [
        "-O2",
        "-g0",
        "-fvisibility=hidden",
        # GCC tries the last map first: put the more specific (nested) prefixes later.
        f"-ffile-prefix-map={sys.prefix}=venv",
        f"-ffile-prefix-map={include}=python",
        f"-ffile-prefix-map={torch_dir}=torch",
        f"-ffile-prefix-map={stage}=.",
    ]


def _compile_env(compiler: str) -> dict[str, str]:
    """Pin the compiler and flags so a caller's CFLAGS or the interpreter's rpath stay out."""
    env = dict(os.environ)
    flags = "-DNDEBUG -Wall"
    env.update(
        {
            "CC": compiler,
            "CXX": compiler,
            "LDSHARED": f"{compiler} -shared",
            "LDCXXSHARED": f"{compiler} -shared",
            "CFLAGS": flags,
            "CXXFLAGS": flags,
            "CPPFLAGS": "",
            "LDFLAGS": "",
            "SOURCE_DATE_EPOCH": "0",
            "LC_ALL": "C",
        }
    )
    return env


def _stage_sources(job: _CompileJob) -> None:
    if job.stage.exists():
        shutil.rmtree(job.stage)
    for rel in job.spec.sources:
        dest = job.stage / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(job.spec.directory / rel, dest)


def _run_compile_jobs(
    jobs: list[_CompileJob], workers: int, compiler: str, work: Path
) -> dict[str, float]:
    """Compile in `workers` subprocesses at once; return seconds per extension."""
    torch_dir = _torch_dir()
    for job in jobs:
        _stage_sources(job)
    groups: list[list[_CompileJob]] = [[] for _ in range(max(1, min(workers, len(jobs))))]
    for i, job in enumerate(jobs):
        groups[i % len(groups)].append(job)
    env = _compile_env(compiler)

    def run_group(index: int, group: list[_CompileJob]) -> dict[str, float]:
        payload = [
            {
                "name": job.name,
                "stage": str(job.stage),
                "sources": list(job.spec.sources),
                "define_macros": [["KERNEL_VERSION", str(job.version)]],
                "extra_compile_args": _compile_flags(job.stage, torch_dir),
                "extra_link_args": ["-s"],
            }
            for job in group
        ]
        jobs_file = work / f"jobs-{index}.json"
        jobs_file.write_text(json.dumps(payload, indent=2))
        proc = subprocess.run(
            [sys.executable, str(COMPILE_SCRIPT), str(jobs_file)],
            check=False,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-6000:]
            names = ", ".join(job.name for job in group)
            raise BuildError(f"compiling {names} failed (exit {proc.returncode}):\n{tail}")
        seconds: dict[str, float] = {}
        for line in proc.stdout.splitlines():
            m = re.fullmatch(r"built (\S+) in ([0-9.]+) s", line.strip())
            if m:
                seconds[m.group(1)] = float(m.group(2))
        return seconds

    result: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        for seconds in pool.map(run_group, range(len(groups)), groups):
            result.update(seconds)
    return result


def _generated_ops_py(namespace: str, compiled: bool, dispatch_key: str) -> str:
    if compiled:
        head = f"from . import {namespace}  # noqa: F401  (loading it registers the ops)\n"
        setup = ""
    else:
        head = "from ._torch_impl import register_ops\nfrom ._version import KERNEL_VERSION\n"
        setup = (
            "# Module-level, so the registrations live as long as this module.\n"
            f'_library = register_ops("{namespace}", "{dispatch_key}", KERNEL_VERSION)\n'
        )
    return (
        "# Generated by examples/kernels/build.py: binds this build's op namespace.\n"
        "import torch\n\n"
        f"{head}\n"
        f"{setup}"
        f"ops = torch.ops.{namespace}\n\n\n"
        "def add_op_namespace_prefix(op_name: str) -> str:\n"
        f'    return "{namespace}::" + op_name\n'
    )


def _generated_version_py(version: int) -> str:
    return (
        "# Generated by examples/kernels/build.py.\n"
        f'__version__ = "{version}.0.0"\n'
        f"KERNEL_VERSION = {version}\n"
    )


def _copy_tree_files(src: Path, dest: Path) -> None:
    for path in _iter_files(src):
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _write_variant(
    dest: Path,
    *,
    spec: KernelSpec,
    version: int,
    variant: str,
    namespace: str,
    library: Path | None,
) -> BuiltVariant:
    """Write one variant folder (flattened layout) with its metadata.json and digest."""
    dest.mkdir(parents=True)
    _copy_tree_files(spec.directory / "torch-ext" / spec.python_name, dest)
    if library is None:
        _copy_tree_files(spec.directory / "torch-noarch" / spec.python_name, dest)
    dispatch_key = NOARCH_DISPATCH_KEYS.get(variant, "CPU")
    (dest / "_ops.py").write_text(_generated_ops_py(namespace, library is not None, dispatch_key))
    (dest / "_version.py").write_text(_generated_version_py(version))
    lib_name: str | None = None
    lib_sha: str | None = None
    if library is not None:
        lib_name = library.name
        shutil.copyfile(library, dest / lib_name)
        lib_sha = hashlib.sha256((dest / lib_name).read_bytes()).hexdigest()
    for path in _iter_files(dest):
        path.chmod(0o755 if path.suffix == ".so" else 0o644)
    metadata = {
        "id": namespace,
        "name": spec.name,
        "version": version,
        "license": LICENSE,
        "kernels-minver": KERNELS_MINVER,
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": variant_digest(dest)},
    }
    (dest / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    (dest / "metadata.json").chmod(0o644)
    files = tuple(p.relative_to(dest).as_posix() for p in _iter_files(dest))
    return BuiltVariant(
        kernel=spec.name,
        version=version,
        variant=variant,
        path=dest,
        module_id=namespace,
        compiled=library is not None,
        library=lib_name,
        library_sha256=lib_sha,
        ops=spec.ops[version],
        files=files,
    )


def _build(cache_dir: Path, key: str, workers: int | None) -> BuiltExamples:
    started = time.monotonic()
    facts = toolchain_facts()
    arch = local_arch_variant()
    work = cache_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    source_hashes = {spec.name: _source_hash(spec) for spec in KERNELS}

    jobs = [
        _CompileJob(
            name=(ns := build_id(spec, version, arch, source_hashes[spec.name])),
            spec=spec,
            version=version,
            stage=work / ns,
        )
        for spec in KERNELS
        if spec.sources
        for version in VERSIONS
    ]
    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    compile_seconds = _run_compile_jobs(jobs, n_workers, facts["compiler"], work)

    partial = cache_dir / f"{key}.partial-{os.getpid()}"
    for stale in cache_dir.glob("*.partial-*"):  # left by a crashed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    kernels: list[BuiltKernel] = []
    for spec in KERNELS:
        for version in VERSIONS:
            kernel_root = partial / spec.name / f"v{version}"
            variants: list[BuiltVariant] = []
            if spec.sources:
                ns = build_id(spec, version, arch, source_hashes[spec.name])
                library = work / ns / "lib" / f"{ns}.abi3.so"
                if not library.is_file():
                    raise BuildError(f"the compiler produced no {library.name}")
                variants.append(
                    _write_variant(
                        kernel_root / "build" / arch,
                        spec=spec,
                        version=version,
                        variant=arch,
                        namespace=ns,
                        library=library,
                    )
                )
            for variant in spec.noarch:
                ns = build_id(spec, version, variant, source_hashes[spec.name])
                variants.append(
                    _write_variant(
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
    (partial / MANIFEST).write_text(json.dumps(_to_manifest(built), indent=2) + "\n")
    final = cache_dir / key
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    shutil.rmtree(work, ignore_errors=True)
    _prune(cache_dir, keep=final)
    loaded = load_cached_build(final)
    assert loaded is not None
    return loaded


def _prune(cache_dir: Path, keep: Path, max_entries: int = 4) -> None:
    """Drop the oldest cache entries beyond max_entries (each source edit makes a new one)."""
    entries = [p for p in cache_dir.iterdir() if p.is_dir() and (p / MANIFEST).is_file()]
    entries.sort(key=lambda p: (p / MANIFEST).stat().st_mtime, reverse=True)
    for old in [p for p in entries if p != keep][max_entries - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def _to_manifest(built: BuiltExamples) -> dict[str, Any]:
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
        job = _CompileJob(name=variant.module_id, spec=spec, version=version, stage=work / "x")
        started = time.monotonic()
        _run_compile_jobs([job], 1, _compiler(), work)
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


# --------------------------------------------------------------------------- git repos


def _git_env(date: str | None = None) -> dict[str, str]:
    """A hermetic git: no user or system config, fixed identity and dates."""
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("GIT_"):
            del env[name]
    env.update(GIT_IDENTITY)
    env.update(
        {
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C",
        }
    )
    if date is not None:
        env["GIT_AUTHOR_DATE"] = date
        env["GIT_COMMITTER_DATE"] = date
    return env


def _git(args: list[str], cwd: Path, date: str | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], check=False, cwd=cwd, env=_git_env(date), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def _readme(spec: KernelSpec, version: int, note: str) -> str:
    return (
        "---\n"
        "library_name: kernels\n"
        f"license: {LICENSE.lower()}\n"
        "tags:\n"
        "- kernel\n"
        "---\n\n"
        f"# {spec.name}\n\n"
        f"{spec.summary}. Example kernel for kerneld's tests, version {version}.\n"
        f"{note}"
    )


def _replace_content(work: Path, kernel: BuiltKernel, spec: KernelSpec, readme: str) -> None:
    for entry in work.iterdir():
        if entry.name == ".git":
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    _copy_tree_files(kernel.path / "build", work / "build")
    for path in _iter_files(work / "build"):
        path.chmod(0o755 if path.suffix == ".so" else 0o644)
    (work / "README.md").write_text(readme)
    if spec.lfs:
        (work / ".gitattributes").write_text("*.so filter=lfs diff=lfs merge=lfs -text\n")


def _make_work_repo(work: Path, built: BuiltExamples, spec: KernelSpec) -> None:
    """History: v1 (branch v1, tag v1.0.0) -> v2 (branch v2, tag v2.0.0) -> README (main)."""
    work.mkdir(parents=True)
    _git(["init", "-q", "-b", "main"], work)
    if spec.lfs:
        _git(["lfs", "install", "--local"], work)
    for version in VERSIONS:
        kernel = built.kernel(spec.name, version)
        _replace_content(work, kernel, spec, _readme(spec, version, ""))
        _git(["add", "-A"], work)
        date = COMMIT_DATES[f"v{version}"]
        _git(["commit", "-q", "-m", f"{spec.name} v{version}"], work, date)
        _git(["branch", f"v{version}"], work)
        _git(["tag", f"v{version}.0.0"], work)
    latest = VERSIONS[-1]
    note = f"\n`main` carries version {latest}.\n"
    (work / "README.md").write_text(_readme(spec, latest, note))
    _git(["add", "-A"], work)
    _git(["commit", "-q", "-m", "README: point at the latest version"], work, COMMIT_DATES["main"])


def _refs(git_dir: Path, kind: str) -> dict[str, str]:
    out = _git(
        [
            "--git-dir",
            str(git_dir),
            "for-each-ref",
            "--format=%(refname:short) %(objectname)",
            kind,
        ],
        git_dir,
    )
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def _create_hub(root: Path, *, bare: bool, built: BuiltExamples) -> HubRoot:
    """Create the repos from scratch with git and git-lfs (what make_hub caches)."""
    org_dir = root / "kernels" / built.org
    org_dir.mkdir(parents=True, exist_ok=True)
    if any(spec.lfs for spec in KERNELS):
        try:
            _git(["lfs", "version"], org_dir)
        except (BuildError, OSError) as e:
            raise BuildError("git-lfs is required (apt-get install git-lfs)") from e
    repos: list[HubRepo] = []
    for spec in KERNELS:
        final = org_dir / spec.name
        if final.exists():
            shutil.rmtree(final)
        if bare:
            staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=org_dir))
            work = staging / spec.name
        else:
            work = final
        _make_work_repo(work, built, spec)
        lfs_paths: tuple[str, ...] = ()
        if spec.lfs:
            listed = _git(["lfs", "ls-files", "--all", "--name-only"], work)
            lfs_paths = tuple(sorted(set(listed.splitlines())))
        if bare:
            _git(["clone", "-q", "--bare", "--no-hardlinks", str(work), str(final)], org_dir)
            _git(["--git-dir", str(final), "remote", "remove", "origin"], org_dir)
            lfs_src = work / ".git" / "lfs" / "objects"
            if lfs_src.is_dir():
                shutil.copytree(lfs_src, final / "lfs" / "objects")
            shutil.rmtree(staging)
        git_dir = final if bare else final / ".git"
        repos.append(
            HubRepo(
                repo_id=f"{built.org}/{spec.name}",
                name=spec.name,
                path=final,
                bare=bare,
                lfs=spec.lfs,
                branches=_refs(git_dir, "refs/heads"),
                tags=_refs(git_dir, "refs/tags"),
                branch_versions={"main": VERSIONS[-1], **{f"v{v}": v for v in VERSIONS}},
                lfs_paths=lfs_paths,
            )
        )
    return HubRoot(root=root, org=built.org, bare=bare, repos=tuple(repos))


def _hub_template(built: BuiltExamples, bare: bool) -> HubRoot:
    """Repos made once per cache entry (git + LFS take ~1 s); make_hub copies them."""
    kind = "bare" if bare else "work"
    root = built.root / f"hub-{kind}"
    info = built.root / f"hub-{kind}.json"

    def load() -> HubRoot | None:
        try:
            data = json.loads(info.read_text())
        except (OSError, ValueError):
            return None
        repos = tuple(
            HubRepo(**{**r, "path": root / r["path"], "lfs_paths": tuple(r["lfs_paths"])})
            for r in data["repos"]
        )
        if not all(r.path.is_dir() for r in repos):
            return None
        return HubRoot(root=root, org=data["org"], bare=bare, repos=repos)

    if (hub := load()) is not None:
        return hub
    with FileLock(str(built.root.parent / ".lock")):
        if (hub := load()) is not None:
            return hub
        if root.exists():
            shutil.rmtree(root)
        hub = _create_hub(root, bare=bare, built=built)
        data = {
            "org": hub.org,
            "repos": [
                {
                    **{k: v for k, v in r.__dict__.items() if k != "path"},
                    "path": r.path.relative_to(root).as_posix(),
                    "branches": dict(r.branches),
                    "tags": dict(r.tags),
                    "branch_versions": dict(r.branch_versions),
                    "lfs_paths": list(r.lfs_paths),
                }
                for r in hub.repos
            ],
        }
        info.write_text(json.dumps(data, indent=2) + "\n")
    return hub


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
    template = _hub_template(built, bare)
    root = Path(dest).resolve()
    org_dir = root / "kernels" / built.org
    org_dir.mkdir(parents=True, exist_ok=True)
    repos: list[HubRepo] = []
    for repo in template.repos:
        final = org_dir / repo.name
        if final.exists():
            shutil.rmtree(final)
        shutil.copytree(repo.path, final, symlinks=True)
        repos.append(replace(repo, path=final))
    return HubRoot(root=root, org=built.org, bare=bare, repos=tuple(repos))


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
