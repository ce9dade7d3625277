"""GPU detection through NVML's real interface: nvidia-ml-py's `pynvml`, the binding the
daemon uses, loads a stand-in `libnvidia-ml.so.1` built here from tests/support/nvml_stub.c
(the NVML entry points detection calls, with nvml.h's C signatures) by its real name through
the dynamic loader. Devices, compute capabilities, a driver that is not loaded, a host without
devices and no library at all; and prefetch planning from what was detected."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import REPO_ROOT

STUB = REPO_ROOT / "tests" / "support" / "nvml_stub.c"
TWO_GPUS = "NVIDIA H100 80GB HBM3,9,0,00000000:17:00.0;NVIDIA A100-SXM4-80GB,8,0,00000000:65:00.0"
CUDA_NAMES = [
    "torch213-cxx11-cu126-x86_64-linux",
    "torch213-cxx11-cu128-x86_64-linux",
    "torch213-cxx11-cu130-x86_64-linux",
    "torch213-cxx11-cpu-x86_64-linux",
    "torch-cuda",
    "torch-cpu",
]

CHILD = """
import json, sys
from pathlib import Path
from kerneld.pipeline.hardware import detect
from kerneld.pipeline.prefetch import plan_variants
hw = detect(Path(sys.argv[1]), machine="x86_64", use_nvml=True)
print(json.dumps({
    "gpus": [[g.vendor, g.name, g.capability, g.location] for g in hw.gpus],
    "driver": hw.nvidia_driver,
    "cuda": hw.cuda_driver,
    "notes": list(hw.notes),
    "plan": sorted(plan_variants(json.loads(sys.argv[2]), hardware=hw, torch_versions=[(2, 13)])),
}))
"""


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (scripts/bootstrap installs g++)")
    out = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(STUB)], check=True)
    return out.parent


def detect_with(tmp: Path, lib: Path | None, **stub: str) -> dict[str, Any]:
    """Detection in a fresh process (the loader reads LD_LIBRARY_PATH at start), over an empty
    root: whatever it finds came through NVML."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO_ROOT / 'client'}:{REPO_ROOT}"}
    if lib is not None:
        env["LD_LIBRARY_PATH"] = str(lib)
    env.update({f"KERNELD_NVML_STUB_{k.upper()}": v for k, v in stub.items()})
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), json.dumps(CUDA_NAMES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_devices_and_capabilities_come_from_nvml(stub_lib: Path, tmp_path: Path) -> None:
    found = detect_with(tmp_path, stub_lib, gpus=TWO_GPUS, driver="570.86.15", cuda="12080")
    assert found["gpus"] == [
        ["nvidia", "NVIDIA H100 80GB HBM3", "9.0", "00000000:17:00.0"],
        ["nvidia", "NVIDIA A100-SXM4-80GB", "8.0", "00000000:65:00.0"],
    ]
    assert (found["driver"], found["cuda"]) == ("570.86.15", [12, 8])
    assert "nvidia via NVML" in found["notes"]
    # Prefetch: the CUDA builds this driver runs (12.8 and older), not cu130, and the noarch ones.
    assert found["plan"] == sorted(
        {
            "torch213-cxx11-cu126-x86_64-linux",
            "torch213-cxx11-cu128-x86_64-linux",
            "torch213-cxx11-cpu-x86_64-linux",
            "torch-cuda",
            "torch-cpu",
        }
    )
    newer = detect_with(tmp_path, stub_lib, gpus=TWO_GPUS, driver="580.82.07", cuda="13000")
    assert "torch213-cxx11-cu130-x86_64-linux" in newer["plan"]


def test_no_driver_no_devices_and_no_library_fall_back_to_the_files(
    stub_lib: Path, tmp_path: Path
) -> None:
    not_loaded = detect_with(tmp_path, stub_lib, init="9", gpus=TWO_GPUS)
    none = detect_with(tmp_path, stub_lib, gpus="")
    missing = detect_with(tmp_path, None)
    for found in (not_loaded, none, missing):
        assert found["gpus"] == [] and found["driver"] is None and found["cuda"] is None, found
        assert "nvidia via NVML" not in found["notes"]
        assert found["plan"] == ["torch-cpu", "torch213-cxx11-cpu-x86_64-linux"], found
