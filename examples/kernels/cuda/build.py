"""Build the CUDA example kernels: real `.cu` sources, sm_80 and sm_90 (cubins + PTX).

    .venv/bin/python -m examples.kernels.cuda.build [--out DIR] [--mirror DIR]

Two kernels: `activation-cuda` (SiLU-and-mul, RMSNorm) and `attention-cuda`, the attention
example's GPU build (its `csrc/attention_kernels.cu` and `attention_cuda.cpp` behind the same
Python package as its CPU build: flash-attn's interface). nvcc comes from the toolkit wheels
(toolkit.py), torch's headers from the project's CPU torch. Each library links cudart statically
and references nothing of libc10_cuda/libtorch_cuda, so it imports on a CPU-only torch (a GPU is
needed only to run its ops). One build is laid out twice: under the legacy variant name
(`torch213-cxx11-cu130-x86_64-linux`, what `kernels` 0.17 loads) and kernels 0.19's
(`torch-2.13-cxx11-cuda-13.0-cpython-3.9-abi3-x86_64-linux`), each with `metadata.json`
`backend: {type: cuda, archs}` read back from the library's fat binary. `--mirror DIR` also
writes a kerneld mirror directory serving them (repos `kerneld-examples/activation-cuda` and
`kerneld-examples/attention-cuda`, branch `main`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from examples.kernels.built import BuiltVariant
from examples.kernels.cache import build_id, kernel_hash
from examples.kernels.cuda.fatbin import FatbinArchs, archs_as_metadata, read_archs
from examples.kernels.cuda.toolkit import CUDA_VERSION, REPO_ROOT, Toolkit, ensure_toolkit
from examples.kernels.specs import ORG, BuildError, KernelSpec
from examples.kernels.toolchain import cxx_compiler
from examples.kernels.variant_files import write_variant

#: The CUDA examples; `sources` is (the `.cu` kernels, the torch side `.cpp`).
SPEC = KernelSpec(
    name="activation-cuda",
    summary="SiLU-and-mul and RMSNorm as CUDA ops (sm_80, sm_90, cubins and PTX)",
    sources=("csrc/activation_kernels.cu", "csrc/activation_cuda.cpp"),
    ops={1: ("silu_and_mul", "rms_norm")},
)
ATTENTION_SPEC = KernelSpec(
    name="attention-cuda",
    summary="The attention example's CUDA build: flash-attn's interface over CUDA ops "
    "(sm_80, sm_90, cubins and PTX)",
    sources=("csrc/attention_kernels.cu", "csrc/attention_cuda.cpp"),
    ops={1: ("varlen_attention", "masked_attention")},
    source_kernel="attention",
)
CUDA_SPECS = (SPEC, ATTENTION_SPEC)
VERSION = 1
SM_ARCHS = (80, 90)
REPO_ID = f"{ORG}/{SPEC.name}"
ATTENTION_REPO_ID = f"{ORG}/{ATTENTION_SPEC.name}"


@dataclass(frozen=True)
class CudaBuild:
    spec: KernelSpec
    root: Path
    variants: tuple[BuiltVariant, ...]
    archs: FatbinArchs
    metadata_archs: tuple[str, ...]
    seconds: float
    downloaded_bytes: int
    wheels: tuple[Path, ...]

    @property
    def repo_id(self) -> str:
        return f"{ORG}/{self.spec.name}"


def default_out(spec: KernelSpec = SPEC) -> Path:
    """Where a kernel's build goes by default (`build` replaces that folder)."""
    suffix = "" if spec is SPEC else f"-{spec.name}"
    return REPO_ROOT / ".cache" / f"cuda-examples{suffix}"


def variant_names() -> tuple[str, str]:
    """(legacy, kernels 0.19) names of this machine's CUDA build for the installed torch."""
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cmaj, cmin = CUDA_VERSION
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    legacy = f"torch{major}{minor}-{abi}-cu{cmaj}{cmin}-x86_64-linux"
    new = f"torch-{major}.{minor}-{abi}-cuda-{cmaj}.{cmin}-cpython-3.9-abi3-x86_64-linux"
    return legacy, new


def _run(cmd: list[str], cwd: Path) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{Path(cmd[0]).name} failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")


def compile_library(toolkit: Toolkit, namespace: str, stage: Path, spec: KernelSpec = SPEC) -> Path:
    """nvcc for the kernels, the C++ compiler for the torch side, one `.abi3.so`."""
    from torch.utils.cpp_extension import include_paths, library_paths

    stage.mkdir(parents=True, exist_ok=True)
    cu_source, cpp_source = (spec.directory / s for s in spec.sources)
    gencode = [
        flag
        for sm in SM_ARCHS
        for flag in ("-gencode", f"arch=compute_{sm},code=[sm_{sm},compute_{sm}]")
    ]
    kernels_obj = stage / f"{cu_source.stem}.o"
    env_path = f"{toolkit.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    nvcc = [
        str(toolkit.nvcc),
        "-c",
        str(cu_source),
        "-o",
        str(kernels_obj),
        "-O3",
        "-std=c++17",
        "-Xcompiler",
        "-fPIC",
        f"-ccbin={cxx_compiler()}",
        *gencode,
    ]
    result = subprocess.run(
        nvcc,
        cwd=stage,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PATH": env_path},
    )
    if result.returncode != 0:
        raise BuildError(f"nvcc failed ({' '.join(nvcc)}):\n{result.stderr[-4000:]}")
    ops_obj = stage / f"{cpp_source.stem}.o"
    includes = [
        f"-I{p}" for p in (*include_paths(), str(toolkit.include), sysconfig.get_paths()["include"])
    ]
    _run(
        [
            cxx_compiler(),
            "-c",
            str(cpp_source),
            "-o",
            str(ops_obj),
            "-O2",
            "-fPIC",
            "-std=c++17",
            "-D_GLIBCXX_USE_CXX11_ABI=1",
            "-DPy_LIMITED_API=0x03090000",
            f"-DTORCH_EXTENSION_NAME={namespace}",
            f"-DKERNEL_VERSION={VERSION}",
            *includes,
        ],
        stage,
    )
    library = stage / f"{namespace}.abi3.so"
    _run(
        [
            cxx_compiler(),
            "-shared",
            "-o",
            str(library),
            str(ops_obj),
            str(kernels_obj),
            str(toolkit.cudart_static),
            *[f"-L{p}" for p in library_paths()],
            "-lc10",
            "-ltorch_cpu",
            "-lpthread",
            "-ldl",
            "-lrt",
            "-Wl,--as-needed",
        ],
        stage,
    )
    return library


def build(out: Path, spec: KernelSpec = SPEC) -> CudaBuild:
    """Compile `spec` and write both variants under `out/build/`; `out` is replaced."""
    started = time.monotonic()
    toolkit = ensure_toolkit()
    legacy, new = variant_names()
    source_hash = kernel_hash(spec)
    if out.exists():
        shutil.rmtree(out)
    variants: list[BuiltVariant] = []
    archs: FatbinArchs | None = None
    for name in (legacy, new):
        # Each variant name makes its own build id (op namespace), as the CPU examples do.
        namespace = build_id(spec, VERSION, name, source_hash)
        library = compile_library(toolkit, namespace, out / "work" / namespace, spec)
        archs = read_archs(library)
        expected = set(SM_ARCHS)
        if set(archs.cubins) != expected or set(archs.ptx) != expected:
            raise BuildError(
                f"{library.name} carries cubins {sorted(archs.cubins)} and PTX "
                f"{sorted(archs.ptx)}, not the sm {sorted(expected)} it was compiled for"
            )
        variant = write_variant(
            out / "build" / name,
            spec=spec,
            version=VERSION,
            variant=name,
            namespace=namespace,
            library=library,
        )
        # write_variant declares a CPU backend; the digest does not cover metadata.json, and
        # the CPU examples' cache key hashes variant_files.py, so patch it here.
        metadata_path = variant.path / "metadata.json"
        metadata = json.loads(metadata_path.read_text())
        metadata["backend"] = {"type": "cuda", "archs": archs_as_metadata(archs)}
        metadata_path.write_text(json.dumps(metadata, indent=2) + "\n")
        variants.append(variant)
    shutil.rmtree(out / "work")
    assert archs is not None
    return CudaBuild(
        spec=spec,
        root=out,
        variants=tuple(variants),
        archs=archs,
        metadata_archs=tuple(archs_as_metadata(archs)),
        seconds=time.monotonic() - started,
        downloaded_bytes=toolkit.downloaded_bytes,
        wheels=toolkit.wheels,
    )


def check_archs(variant_dir: Path) -> tuple[list[str], list[str]]:
    """(archs declared by metadata.json, archs read from the `.so`): equal for a sound build."""
    metadata = json.loads((variant_dir / "metadata.json").read_text())
    declared = list(metadata.get("backend", {}).get("archs", []))
    libraries = sorted(variant_dir.glob("*.so"))
    if len(libraries) != 1:
        raise BuildError(f"{variant_dir} holds {len(libraries)} shared libraries, expected one")
    return declared, archs_as_metadata(read_archs(libraries[0]))


def write_mirror(builds: CudaBuild | Sequence[CudaBuild], dest: Path) -> dict[str, str]:
    """A kerneld mirror directory serving each build as `kerneld-examples/<name>`, branch
    `main`; returns repo id -> commit id (a hash of the variants' files, stable per build)."""
    from kerneld.mirror.documents import Manifest, MirrorWriter
    from kerneld.upstream.base import RemoteFile

    if dest.exists():
        shutil.rmtree(dest)
    writer = MirrorWriter(dest, name="kerneld-examples-cuda")
    commits: dict[str, str] = {}
    for built in [builds] if isinstance(builds, CudaBuild) else builds:
        commit_hash = hashlib.sha1(usedforsecurity=False)
        variants: dict[str, list[RemoteFile]] = {}
        for variant in built.variants:
            files = []
            for rel in variant.files:
                data = (variant.path / rel).read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                writer.write_blob(sha, data)
                files.append(RemoteFile(rel, len(data), sha256=sha))
                commit_hash.update(f"{variant.variant}/{rel}\0{sha}\0".encode())
            variants[variant.variant] = files
        commit = commit_hash.hexdigest()
        writer.write_manifest(Manifest(built.repo_id, commit, variants))
        writer.write_refs(built.repo_id, {"main": commit}, {})
        commits[built.repo_id] = commit
    writer.write_info()
    return commits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="activation-cuda's build folder (attention-cuda's: DIR-attention-cuda)",
    )
    parser.add_argument("--mirror", type=Path, help="also write a kerneld mirror directory here")
    args = parser.parse_args(argv)
    builds: list[CudaBuild] = []
    try:
        for spec in CUDA_SPECS:
            out = default_out(spec)
            if args.out is not None:
                out = (
                    args.out if spec is SPEC else args.out.with_name(f"{args.out.name}-{spec.name}")
                )
            built = build(out.resolve(), spec)
            builds.append(built)
            for variant in built.variants:
                declared, found = check_archs(variant.path)
                verdict = "match" if declared == found else "MISMATCH"
                print(
                    f"{spec.name} {variant.variant}: metadata archs {declared}, "
                    f".so archs {found}: {verdict}"
                )
                if declared != found:
                    return 1
            mib = built.downloaded_bytes / 2**20
            print(
                f"built {spec.name} in {built.seconds:.1f} s (downloaded {mib:.1f} MiB of wheels)"
            )
        if args.mirror is not None:
            for repo_id, commit in write_mirror(builds, args.mirror.resolve()).items():
                print(f"mirror {args.mirror}: {repo_id}@main = {commit}")
    except BuildError as e:
        print(f"cuda build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
