"""The C++ toolchain: what the built bytes depend on, and compiling the extensions with it.

`toolchain_facts()` names the torch, compiler and platform a build used (they key the cache);
`run_compile_jobs()` compiles extensions in parallel subprocesses (`_compile_ext.py`) with flags
and an environment pinned so that the same sources give the same library anywhere.
"""

from __future__ import annotations

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
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from examples.kernels.specs import HERE, BuildError, KernelSpec

COMPILE_SCRIPT = HERE / "_compile_ext.py"


def cxx_compiler() -> str:
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
    cxx = cxx_compiler()
    try:
        cc_version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"cannot run the C++ compiler {cxx!r}: {e}") from e
    return {
        "torch": importlib.metadata.version("torch"),
        "torch_git": git.group(1) if git else "",
        "compiler": cxx,
        "compiler_version": cc_version,
        "setuptools": importlib.metadata.version("setuptools"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "machine": platform.machine(),
        "system": platform.system(),
    }


def local_arch_variant(name_format: str = "legacy") -> str:
    """The torch arch variant name of a CPU build for this machine, as `kernels` spells it.

    `torch<major><minor>[-cxx11|-cxx98]-cpu-<cpu>-<os>`: the ABI tag only on Linux. The backend
    is always `cpu` because the example ops are CPU code, whatever backend torch was built for.
    `name_format="new"`: the same build named as `kernels` 0.19 names it,
    `torch-<major>.<minor>[-cxx11|-cxx98]-cpu-cpython-3.9-abi3-<cpu>-<os>` (the extension uses
    the stable ABI of Python 3.9, as every legacy arch build implicitly does).
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
    if name_format == "new" and system in ("linux", "darwin", "windows"):
        return f"torch-{major}.{minor}{abi}-cpu-cpython-3.9-abi3-{cpu}-{system}"
    if system in ("linux", "darwin", "windows") and len(major) == 1:
        return f"torch{major}{minor}{abi}-cpu-{cpu}-{system}"
    raise BuildError(f"cannot name a variant for torch {torch.__version__} on {system}")


@dataclass(frozen=True)
class CompileJob:
    """One extension to compile: sources staged under `stage`, the library in `stage/lib/`."""

    name: str  # extension name == op namespace
    spec: KernelSpec
    version: int
    stage: Path


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


def _stage_sources(job: CompileJob) -> None:
    if job.stage.exists():
        shutil.rmtree(job.stage)
    for rel in job.spec.sources:
        dest = job.stage / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(job.spec.directory / rel, dest)


def run_compile_jobs(
    jobs: list[CompileJob], workers: int, compiler: str, work: Path
) -> dict[str, float]:
    """Compile in `workers` subprocesses at once; return seconds per extension."""
    torch_dir = _torch_dir()
    for job in jobs:
        _stage_sources(job)
    groups: list[list[CompileJob]] = [[] for _ in range(max(1, min(workers, len(jobs))))]
    for i, job in enumerate(jobs):
        groups[i % len(groups)].append(job)
    env = _compile_env(compiler)

    def run_group(index: int, group: list[CompileJob]) -> dict[str, float]:
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
