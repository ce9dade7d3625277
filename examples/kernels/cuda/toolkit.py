"""The CUDA toolkit from pip wheels: nvcc, the runtime headers and static cudart, no CUDA torch.

`nvidia-cuda-nvcc` (13.x) ships a whole compiler driver (nvcc, cudafe++, ptxas, nvlink,
fatbinary) under `nvidia/cu13/`; the runtime and CCCL wheels add the headers and
`libcudart_static.a`. The wheels are downloaded once into `.cache/cuda-wheels/` (pip's ordinary
client) and unpacked into `.cache/cuda-toolkit/<hash of the wheels>/`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from examples.kernels.specs import BuildError

REPO_ROOT = Path(__file__).resolve().parents[3]
WHEELS_ENV = "KERNELD_CUDA_WHEELS"
# Matching CUDA 13.0 releases: the variant name says cu130, so the compiler must be 13.0.
WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",  # cicc, nvcc's device front end
)
CUDA_VERSION = (13, 0)


@dataclass(frozen=True)
class Toolkit:
    root: Path  # the folder holding bin/, include/, lib/
    wheels: tuple[Path, ...]
    downloaded_bytes: int  # 0 when the wheels were already cached

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def include(self) -> Path:
        return self.root / "include"

    @property
    def cudart_static(self) -> Path:
        return self.root / "lib" / "libcudart_static.a"


def wheel_dir() -> Path:
    env = os.environ.get(WHEELS_ENV)
    return Path(env).resolve() if env else REPO_ROOT / ".cache" / "cuda-wheels"


def _cached_wheels(folder: Path) -> list[Path] | None:
    found = []
    for requirement in WHEELS:
        name, version = requirement.split("==")
        stem = f"{name.replace('-', '_')}-{version}-"
        matches = sorted(folder.glob(f"{stem}*.whl"))
        if not matches:
            return None
        found.append(matches[0])
    return found


def fetch_wheels(folder: Path | None = None) -> tuple[list[Path], int]:
    """The toolkit wheels, downloaded with pip when absent; returns them and the bytes fetched."""
    folder = folder or wheel_dir()
    cached = _cached_wheels(folder) if folder.is_dir() else None
    if cached is not None:
        return cached, 0
    folder.mkdir(parents=True, exist_ok=True)
    before = sum(p.stat().st_size for p in folder.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    result = subprocess.run(
        [*cmd, "--dest", str(folder), *WHEELS], capture_output=True, text=True, check=False
    )
    wheels = _cached_wheels(folder)
    if result.returncode != 0 or wheels is None:
        raise BuildError(
            f"pip could not download the CUDA toolkit wheels {', '.join(WHEELS)} into {folder}; "
            f"check the package index, or put the wheels there ({WHEELS_ENV} names another "
            f"folder):\n{result.stderr[-2000:]}"
        )
    after = sum(p.stat().st_size for p in folder.glob("*.whl"))
    return wheels, after - before


def ensure_toolkit(wheels_folder: Path | None = None) -> Toolkit:
    """Unpack the wheels (once per set of wheels) and return the toolkit in them."""
    wheels, downloaded = fetch_wheels(wheels_folder)
    h = hashlib.sha256()
    for wheel in wheels:
        h.update(wheel.name.encode() + b"\0" + str(wheel.stat().st_size).encode() + b"\0")
    dest = REPO_ROOT / ".cache" / "cuda-toolkit" / h.hexdigest()[:16]
    root = dest / "nvidia" / "cu13"
    if not (dest / ".complete").is_file():
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(dest)
        for tool in dest.rglob("bin/*"):  # zip files keep no modes: nvcc, ptxas, nvvm's cicc
            if tool.is_file():
                tool.chmod(0o755)
        (dest / ".complete").write_text("\n".join(w.name for w in wheels) + "\n")
    toolkit = Toolkit(root=root, wheels=tuple(wheels), downloaded_bytes=downloaded)
    if not toolkit.nvcc.is_file() or not toolkit.cudart_static.is_file():
        raise BuildError(f"the CUDA wheels in {dest} lack nvcc or libcudart_static.a")
    return toolkit
