"""What a build produced, as its callers see it: variants, kernel versions, the whole build.

These are read back from the cache manifest (examples/kernels/cache.py) on every call, cold or
warm, so a test never holds paths that a build did not verify.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from examples.kernels.specs import ORG


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
    layout: str = "files"  # metadata `build-layout`: `files`, or `zip` (the package in <id>.zip)

    @property
    def namespace(self) -> str:
        return self.module_id

    @property
    def init_file(self) -> Path:
        """The package's `__init__.py` (files layout), or its archive (zip layout)."""
        if self.layout == "zip":
            return self.path / f"{self.module_id}.zip"
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
