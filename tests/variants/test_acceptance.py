"""Which variants a platform accepts, and why not, against a table; device architectures
(`backend.archs` of metadata.json) against the local devices."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kerneld_client.variants import (
    UNRECOGNISED,
    Backend,
    PlatformFacts,
    arch_compatible,
    device_compatible,
)
from tests.variants.support import (
    F_CANN,
    F_CPU,
    F_CU128,
    F_CU130,
    F_FT313,
    F_FT315,
    F_MAC,
    F_NO_TORCH,
    F_OLD_MAC,
    F_ROCM,
    F_TVM,
    F_WIN,
    F_XPU,
    B,
    verdict,
)

F_ROCM714 = replace(F_ROCM, backend=Backend(B.ROCM, (7, 14)))
F_CANN810 = replace(F_CANN, backend=Backend(B.CANN, (8, 10)))

ACCEPT_TABLE: list[tuple[PlatformFacts, str, bool, str]] = [
    # CUDA: same major, variant minor <= local minor.
    (F_CU128, "torch29-cxx11-cu128-x86_64-linux", True, ""),
    (F_CU128, "torch29-cxx11-cu126-x86_64-linux", True, ""),
    (F_CU128, "torch29-cxx11-cu120-x86_64-linux", True, ""),
    (
        F_CU128,
        "torch29-cxx11-cu129-x86_64-linux",
        False,
        "CUDA 12.9 is newer than the local CUDA 12.8",
    ),
    (
        F_CU130,
        "torch213-cxx11-cu131-x86_64-linux",
        False,
        "CUDA 13.1 is newer than the local CUDA 13.0",
    ),
    (F_CU130, "torch213-cxx11-cu128-x86_64-linux", False, "another major version"),
    (F_CU128, "torch29-cxx11-cu118-x86_64-linux", False, "another major version"),
    (F_CU128, "torch29-cxx11-cpu-x86_64-linux", False, "CPU != local CUDA 12.8"),
    (F_CPU, "torch213-cxx11-cu130-x86_64-linux", False, "CUDA 13.0 != local CPU"),
    # Torch version and ABI.
    (F_CU130, "torch212-cxx11-cu130-x86_64-linux", False, "torch 2.12 != local torch 2.13"),
    (F_CPU, "torch213-cxx98-cpu-x86_64-linux", False, "ABI cxx98 != local cxx11"),
    (replace(F_CPU, cxx11_abi=False), "torch213-cxx98-cpu-x86_64-linux", True, ""),
    (replace(F_CPU, cxx11_abi=False), "torch213-cxx11-cpu-x86_64-linux", False, "ABI cxx11"),
    (F_CPU, "torch2013-cpu-x86_64-linux", True, ""),
    (F_NO_TORCH, "torch213-cpu-x86_64-linux", False, "needs torch, which is not installed"),
    # CPU and OS.
    (F_CPU, "torch213-cpu-aarch64-linux", False, "CPU aarch64 != local CPU x86_64"),
    (F_CPU, "torch213-cpu-x86_64-darwin", False, "OS darwin != local OS linux"),
    (F_WIN, "torch213-cu126-x86_64-windows", True, ""),
    (F_WIN, "torch213-cxx11-cu126-x86_64-windows", False, "ABI cxx11 != local none"),
    # Stable ABI: <= local torch.
    (F_CPU, "torch-stable-abi213-cpu-x86_64-linux", True, ""),
    (F_CPU, "torch-stable-abi28-cpu-x86_64-linux", True, ""),
    (F_CPU, "torch-stable-abi214-cpu-x86_64-linux", False, "stable ABI 2.14 is newer"),
    (F_CPU, "torch-stable-abi30-cpu-x86_64-linux", False, "stable ABI 3.0 is newer"),
    (F_NO_TORCH, "torch-stable-abi28-cpu-x86_64-linux", False, "which is not installed"),
    # ROCm as CUDA (0.19.1; 0.17.2 wanted the exact version): same major, minor <= local.
    (F_ROCM, "torch210-cxx11-rocm64-x86_64-linux", True, ""),
    (F_ROCM, "torch210-cxx11-rocm63-x86_64-linux", True, ""),
    (F_ROCM, "torch210-cxx11-rocm65-x86_64-linux", False, "ROCm 6.5 is newer than the local"),
    (F_ROCM, "torch210-cxx11-rocm71-x86_64-linux", False, "another major version"),
    (F_ROCM, "torch210-cxx11-rocm064-x86_64-linux", True, ""),
    (F_ROCM714, "torch210-cxx11-rocm714-x86_64-linux", True, ""),
    (F_ROCM714, "torch210-cxx11-rocm71-x86_64-linux", True, ""),
    # XPU, CANN: the exact version, compared as versions (`cann810` is CANN 81.0).
    (F_XPU, "torch29-cxx11-xpu20253-x86_64-linux", True, ""),
    (F_XPU, "torch29-cxx11-xpu20252-x86_64-linux", False, "XPU 2025.2 != local XPU 2025.3"),
    (F_CANN, "torch28-cxx11-cann81-aarch64-linux", True, ""),
    (F_CANN, "torch28-cxx11-cann80-aarch64-linux", False, "CANN 8.0 != local CANN 8.1"),
    (F_CANN810, "torch28-cxx11-cann810-aarch64-linux", False, "CANN 81.0 != local CANN 8.10"),
    # tvm-ffi: exact.
    (F_TVM, "tvm-ffi01-cu128-x86_64-linux", True, ""),
    (F_TVM, "tvm-ffi01-cu126-x86_64-linux", True, ""),
    (F_TVM, "tvm-ffi02-cu128-x86_64-linux", False, "tvm-ffi 0.2 != local tvm-ffi 0.1"),
    (F_CU128, "tvm-ffi01-cu128-x86_64-linux", False, "needs tvm-ffi, which is not installed"),
    # Metal needs macOS >= 26.
    (F_MAC, "torch213-metal-aarch64-darwin", True, ""),
    (F_MAC, "torch-stable-abi212-metal-aarch64-darwin", True, ""),
    (F_OLD_MAC, "torch213-metal-aarch64-darwin", False, "Metal needs macOS >= 26"),
    (replace(F_MAC, macos_version=None), "torch213-metal-aarch64-darwin", False, "macOS >= 26"),
    (replace(F_MAC, macos_version=(25, 9)), "torch213-metal-aarch64-darwin", False, "macOS >= 26"),
    (replace(F_MAC, macos_version=(26,)), "torch213-metal-aarch64-darwin", True, ""),
    (F_OLD_MAC, "torch-metal", True, ""),
    (F_MAC, "torch213-cpu-aarch64-darwin", False, "CPU != local Metal"),
    # Noarch.
    (F_CPU, "torch-cpu", True, ""),
    (F_CPU, "torch-universal", True, ""),
    (F_CPU, "torch-cuda", False, "noarch backend cuda != local backend cpu"),
    (F_CU130, "torch-cuda", True, ""),
    (F_CU130, "torch-cpu", False, "noarch backend cpu != local backend cuda"),
    (F_ROCM, "torch-rocm", True, ""),
    (F_XPU, "torch-xpu", True, ""),
    # A CANN machine loads `torch-cann` (0.19.1; 0.17.2 loaded `torch-npu` there).
    (F_CANN, "torch-cann", True, ""),
    (F_CANN, "torch-npu", False, "kernels >= 0.19 loads torch-cann on CANN"),
    (F_NO_TORCH, "torch-cpu", True, ""),
    (F_NO_TORCH, "torch-universal", True, ""),
    # Free-threaded CPython never loads abi3, which every legacy arch name is (0.19.1; 0.17.2
    # let 3.15+ load it): noarch names, or new-format abi3t ones.
    (F_FT313, "torch213-cxx11-cu128-x86_64-linux", False, "cannot load on free-threaded"),
    (F_FT313, "torch-stable-abi210-cu128-x86_64-linux", False, "free-threaded"),
    (F_FT313, "torch-cuda", True, ""),
    (F_FT313, "torch-universal", True, ""),
    (F_FT315, "torch213-cxx11-cpu-x86_64-linux", False, "...-cpython-3.15-abi3t-..."),
    (F_FT315, "torch-2.13-cxx11-cpu-cpython-3.15-abi3t-x86_64-linux", True, ""),
    (F_FT315, "torch-cpu", True, ""),
    # Unrecognised.
    (F_CPU, "torch213-cxx11-cpu-x86_64", False, UNRECOGNISED),
]


@pytest.mark.parametrize(
    ("f", "name", "ok", "why"),
    ACCEPT_TABLE,
    ids=[f"{i}-{n}" for i, (_, n, _, _) in enumerate(ACCEPT_TABLE)],
)
def test_acceptance_table(f: PlatformFacts, name: str, ok: bool, why: str) -> None:
    d = verdict(name, f)
    assert d.accepted is ok, d.reason
    assert (d.rank == 0) if ok else (d.rank == -1)
    if ok:
        assert d.reason == ""
    else:
        assert why in d.reason


# ------------------------------------------------------------------------------------------
# Device architectures
# ------------------------------------------------------------------------------------------

ARCH_TABLE = [
    (["8.0"], "8.0", True),
    (["8.0"], "8.6", True),
    (["8.6"], "8.0", False),
    (["8.0"], "9.0", False),
    (["9.0a"], "9.0", True),
    (["9.0a"], "9.1", False),
    (["10.0f"], "10.3", True),
    (["10.0f"], "12.0", False),
    (["10.3f"], "10.0", False),
    (["8.0+PTX"], "9.0", True),
    (["8.0+PTX"], "12.0", True),
    (["8.0+PTX"], "7.5", False),
    (["9.0a+PTX"], "10.0", False),
    (["7.5", "8.0", "9.0"], "8.9", True),
    (["7.5", "9.0a"], "8.9", False),
    ([], "9.0", True),
    (["sm_90"], "9.0", True),  # unknown format only: cannot tell, allowed (as `kernels`)
    (["sm_90", "8.0"], "9.0", False),
    (["gfx942", "gfx90a"], "gfx942", True),
    (["gfx942", "gfx90a"], "gfx90a:sramecc+:xnack-", True),
    (["gfx942"], "gfx1100", False),
]


@pytest.mark.parametrize(("archs", "cap", "ok"), ARCH_TABLE)
def test_arch_compatible(archs: list[str], cap: str, ok: bool) -> None:
    result, why = arch_compatible(archs, cap)
    assert result is ok, why
    assert why


def _device_ok(btype: str, archs: list[str], f: PlatformFacts) -> tuple[bool, str]:
    return device_compatible(btype, archs, f.backend.type.value, f.device_capabilities)


def test_device_compatible() -> None:
    gpu = replace(F_CU130, device_capabilities=("9.0",))
    assert _device_ok("cuda", ["8.0", "9.0"], gpu)[0]
    ok, why = _device_ok("cuda", ["8.0"], gpu)
    assert not ok and "9.0" in why
    # Checked only where `kernels` checks: matching backend, known devices.
    assert _device_ok("cuda", ["8.0"], gpu.with_backend("cpu"))[0]
    assert _device_ok("cpu", ["8.0"], gpu)[0]
    assert _device_ok("cuda", ["8.0"], F_CU130)[0]
    rocm = replace(F_ROCM, device_capabilities=("gfx942",))
    assert _device_ok("rocm", ["gfx942"], rocm)[0]
    assert not _device_ok("rocm", ["gfx90a"], rocm)[0]
