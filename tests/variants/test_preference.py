"""The order of the accepted variants: `kernels`' reference example, CUDA, tvm-ffi, an explicit
CPU request on a GPU machine, duplicates and unrecognised names; best_variant and summarize."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kerneld_client.variants import (
    best_variant,
    decide,
    summarize,
)
from tests.variants.support import (
    CPU,
    F_CPU,
    F_CU128,
    F_CU130,
    accepted,
)


def test_reference_example_order() -> None:
    names = [
        "torch-universal",
        "torch-cpu",
        "torch213-cxx11-cpu-x86_64-linux",
        "torch213-cpu-x86_64-linux",
        "torch-stable-abi210-cpu-x86_64-linux",
    ]
    assert accepted(names, F_CPU) == list(reversed(names))


def test_order_on_cuda() -> None:
    names = [
        "torch-universal",
        "torch-cuda",
        "tvm-ffi01-cu128-x86_64-linux",
        "tvm-ffi01-cu126-x86_64-linux",
        "torch29-cxx11-cu128-x86_64-linux",
        "torch29-cxx11-cu126-x86_64-linux",
        "torch29-cu126-x86_64-linux",
        "torch29-cu124-x86_64-linux",
        "torch-stable-abi28-cu128-x86_64-linux",
        "torch-stable-abi29-cu126-x86_64-linux",
        "torch-stable-abi29-cu128-x86_64-linux",
        "torch29-cxx11-cu129-x86_64-linux",
    ]
    f = replace(F_CU128, tvm_ffi_version=(0, 1))
    assert accepted(names, f) == [
        # Newest stable ABI first, then the highest CUDA minor.
        "torch-stable-abi29-cu128-x86_64-linux",
        "torch-stable-abi29-cu126-x86_64-linux",
        "torch-stable-abi28-cu128-x86_64-linux",
        # Untagged before tagged, even when the tagged one has a higher CUDA minor.
        "torch29-cu126-x86_64-linux",
        "torch29-cu124-x86_64-linux",
        "torch29-cxx11-cu128-x86_64-linux",
        "torch29-cxx11-cu126-x86_64-linux",
        "tvm-ffi01-cu128-x86_64-linux",
        "tvm-ffi01-cu126-x86_64-linux",
        "torch-cuda",
        "torch-universal",
    ]


def test_tvm_ffi_before_noarch_even_when_kernels_ties() -> None:
    f = replace(F_CPU, tvm_ffi_version=(0, 1))
    for names in (
        ["torch-cpu", "tvm-ffi01-cpu-x86_64-linux"],
        ["tvm-ffi01-cpu-x86_64-linux", "torch-cpu"],
    ):
        assert accepted(names, f) == ["tvm-ffi01-cpu-x86_64-linux", "torch-cpu"]


def test_explicit_cpu_on_a_cuda_machine() -> None:
    names = [
        "torch213-cxx11-cu130-x86_64-linux",
        "torch213-cxx11-cpu-x86_64-linux",
        "torch-cuda",
        "torch-cpu",
        "torch-universal",
    ]
    gpu = replace(F_CU130, device_capabilities=("9.0",))
    assert accepted(names, gpu) == [
        "torch213-cxx11-cu130-x86_64-linux",
        "torch-cuda",
        "torch-universal",
    ]
    cpu = gpu.with_backend("cpu")
    assert cpu.backend == CPU and cpu.backend_explicit and cpu.device_capabilities == ()
    assert accepted(names, cpu) == [
        "torch213-cxx11-cpu-x86_64-linux",
        "torch-cpu",
        "torch-universal",
    ]
    again = gpu.with_backend("cuda")
    assert again.backend == gpu.backend and again.backend_explicit
    assert gpu.with_backend(None) is gpu
    with pytest.raises(ValueError, match="supported backends: cpu, cuda"):
        gpu.with_backend("rocm")


def test_decide_dedupes_and_keeps_unrecognised_last() -> None:
    ds = decide(["junk", "torch-cpu", "torch-cpu", "torch-cuda", "torch-universal"], F_CPU)
    assert [d.variant for d in ds] == ["torch-cpu", "torch-universal", "torch-cuda", "junk"]
    assert [d.rank for d in ds] == [0, 1, -1, -1]


def test_best_variant_and_summary() -> None:
    assert best_variant(["torch-universal", "torch-cpu"], F_CPU) == "torch-cpu"
    assert best_variant(["torch-cuda", "junk"], F_CPU) is None
    assert best_variant([], F_CPU) is None
    ds = decide(
        ["torch-cuda", "torch213-cxx11-cu131-x86_64-linux", "x"], F_CU130.with_backend("cpu")
    )
    text = summarize(ds, F_CU130.with_backend("cpu"))
    assert (
        text.splitlines()[0]
        == "platform: torch 2.13 cxx11, CPU (requested), x86_64-linux, Python 3.11.7"
    )
    assert "torch-cuda: rejected: noarch backend cuda != local backend cpu" in text
    assert "x: rejected: unrecognised variant name" in text
    ok = summarize(decide(["torch-cpu", "torch-universal"], F_CPU))
    assert ok == "torch-cpu: accepted (preferred)\ntorch-universal: accepted"
    assert "no build variants" in summarize([])
