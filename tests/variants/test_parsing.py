"""Variant names parsed against a table (`kernels`' number grammar included); malformed names
are reported, never raised; parsing is total."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld_client.variants import (
    UNRECOGNISED,
    Abi,
    Backend,
    PythonAbi,
    UnrecognisedVariant,
    Variant,
    VariantKind,
    parse_backend,
    parse_variant,
    parse_version,
)
from tests.variants.support import (
    CPU,
    MALFORMED,
    NEW_MALFORMED,
    B,
    cuda,
    facts,
    verdict,
)

PARSE_TABLE = [
    (
        "torch213-cxx11-cu130-x86_64-linux",
        dict(
            kind=VariantKind.TORCH_ARCH,
            torch_version=(2, 13),
            abi=Abi.CXX11,
            backend=cuda(13, 0),
            cpu="x86_64",
            os="linux",
        ),
    ),
    (
        "torch29-cxx98-cu128-aarch64-linux",
        dict(kind=VariantKind.TORCH_ARCH, torch_version=(2, 9), abi=Abi.CXX98, backend=cuda(12, 8)),
    ),
    ("torch213-cpu-x86_64-linux", dict(abi=Abi.NONE, backend=CPU, cpu="x86_64")),
    ("torch210-metal-aarch64-darwin", dict(backend=Backend(B.METAL), os="darwin")),
    ("torch29-cu126-x86_64-windows", dict(backend=cuda(12, 6), os="windows")),
    ("torch210-cxx11-rocm64-x86_64-linux", dict(backend=Backend(B.ROCM, (6, 4)))),
    ("torch29-cxx11-xpu20253-x86_64-linux", dict(backend=Backend(B.XPU, (2025, 3)))),
    ("torch28-cxx11-cann81-aarch64-linux", dict(backend=Backend(B.CANN, (8, 1)))),
    ("torch29-neuron-x86_64-linux", dict(backend=Backend(B.NEURON))),
    ("torch29-tpu-x86_64-linux", dict(backend=Backend(B.TPU))),
    (
        "torch-stable-abi210-cu128-x86_64-linux",
        dict(kind=VariantKind.STABLE_ABI, torch_version=(2, 10), backend=cuda(12, 8)),
    ),
    (
        "tvm-ffi01-cu128-x86_64-linux",
        dict(kind=VariantKind.TVM_FFI, tvm_ffi_version=(0, 1), torch_version=None),
    ),
    ("tvm-ffi012-cpu-aarch64-darwin", dict(tvm_ffi_version=(0, 12))),
    ("torch-cpu", dict(kind=VariantKind.NOARCH, backend=CPU, cpu=None, os=None)),
    ("torch-cuda", dict(kind=VariantKind.NOARCH, backend=Backend(B.CUDA))),
    ("torch-rocm", dict(kind=VariantKind.NOARCH, backend=Backend(B.ROCM))),
    ("torch-xpu", dict(kind=VariantKind.NOARCH, backend=Backend(B.XPU))),
    ("torch-metal", dict(kind=VariantKind.NOARCH, backend=Backend(B.METAL))),
    ("torch-npu", dict(kind=VariantKind.NOARCH, backend=Backend(B.NPU))),
    ("torch-neuron", dict(kind=VariantKind.NOARCH, backend=Backend(B.NEURON))),
    ("torch-universal", dict(kind=VariantKind.UNIVERSAL, backend=None)),
    # `kernels`' number grammar: torch major is one digit; backend minor is the LAST digit.
    ("torch2013-cpu-x86_64-linux", dict(torch_version=(2, 13))),
    ("torch213-cu1210-x86_64-linux", dict(backend=cuda(121, 0))),
    ("torch213-rocm700-x86_64-linux", dict(backend=Backend(B.ROCM, (70, 0)))),
    # ... except `rocm714`, which 0.19.1 reads as ROCm 7.14 (`rocm7140` is 714.0 again).
    ("torch210-cxx11-rocm714-x86_64-linux", dict(backend=Backend(B.ROCM, (7, 14)))),
    ("torch210-cxx11-rocm7140-x86_64-linux", dict(backend=Backend(B.ROCM, (714, 0)))),
    ("torch29-cxx11-xpu202510-x86_64-linux", dict(backend=Backend(B.XPU, (20251, 0)))),
    # Legacy arch names are implicitly cpython-3.9-abi3.
    ("torch213-cpu-x86_64-linux", dict(legacy=True, python_min=(3, 9), python_abi=PythonAbi.ABI3)),
    # kernels 0.19's format: dotted versions, full backend names, a minimum Python and its ABI.
    (
        "torch-2.13-cxx11-cpu-cpython-3.9-abi3-x86_64-linux",
        dict(
            kind=VariantKind.TORCH_ARCH,
            torch_version=(2, 13),
            abi=Abi.CXX11,
            backend=CPU,
            python_min=(3, 9),
            python_abi=PythonAbi.ABI3,
            cpu="x86_64",
            os="linux",
            legacy=False,
        ),
    ),
    ("torch-2.13-cuda-12.8-cpython-3.12-abi3-x86_64-linux", dict(backend=cuda(12, 8))),
    ("torch-10.2-rocm-7.14-cpython-3.9-abi3-x86_64-linux", dict(torch_version=(10, 2))),
    ("torch-2.9-rocm-7.14-cpython-3.9-abi3-x86_64-linux", dict(backend=Backend(B.ROCM, (7, 14)))),
    (
        "torch-2.13-cpu-cpython-3.15-abi3t-aarch64-darwin",
        dict(python_min=(3, 15), python_abi=PythonAbi.ABI3T, os="darwin"),
    ),
    (
        "torch-stable-abi-2.11-xpu-2025.3-cpython-3.10-abi3-x86_64-linux",
        dict(kind=VariantKind.STABLE_ABI, torch_version=(2, 11), backend=Backend(B.XPU, (2025, 3))),
    ),
    (
        "tvm-ffi-0.1-cann-8.1-cpython-3.9-abi3-aarch64-linux",
        dict(kind=VariantKind.TVM_FFI, tvm_ffi_version=(0, 1), backend=Backend(B.CANN, (8, 1))),
    ),
    ("sdk", dict(kind=VariantKind.SDK, backend=None, cpu=None, python_min=None, legacy=False)),
    ("sdk-cuda", dict(kind=VariantKind.SDK, backend=Backend(B.CUDA), cpu=None)),
    (
        "sdk-cpython-3.12-abi3-x86_64-linux",
        dict(kind=VariantKind.SDK, backend=None, python_min=(3, 12), cpu="x86_64"),
    ),
    (
        "sdk-cuda-12.8-cpython-3.12-abi3-x86_64-linux",
        dict(kind=VariantKind.SDK, backend=cuda(12, 8), python_min=(3, 12), os="linux"),
    ),
    ("mlx-metal", dict(kind=VariantKind.MLX_NOARCH, backend=Backend(B.METAL), legacy=False)),
    ("mlx-universal", dict(kind=VariantKind.MLX_NOARCH, backend=None)),
]


@pytest.mark.parametrize(
    "name",
    [
        "torch-2.013-cpu-cpython-3.09-abi3-x86_64-linux",
        "torch-stable-abi-2.11-cuda-12.8-cpython-3.10-abi3-x86_64-linux",
        "tvm-ffi-0.1-cpu-cpython-3.9-abi3-x86_64-linux",
        "sdk-rocm-6.4-cpython-3.15-abi3t-x86_64-linux",
        "sdk-cpu",
        "mlx-universal",
        "torch213-cxx11-cu130-x86_64-linux",
    ],
)
def test_canonical_names_are_kernels_spelling(name: str) -> None:
    """`canonical_name` is `kernels`' `variant_str` of the parsed name: itself, but with the
    zero-padded numbers normalised."""
    v = parse_variant(name)
    assert isinstance(v, Variant)
    expected = name.replace("2.013", "2.13").replace("3.09", "3.9")
    assert v.canonical_name == expected


@pytest.mark.parametrize(("name", "expected"), PARSE_TABLE, ids=[n for n, _ in PARSE_TABLE])
def test_parse_table(name: str, expected: dict[str, object]) -> None:
    v = parse_variant(name)
    assert isinstance(v, Variant), v
    assert v.name == name
    for key, value in expected.items():
        assert getattr(v, key) == value, key


@pytest.mark.parametrize("name", [*MALFORMED, *NEW_MALFORMED])
def test_malformed_names_are_reported_not_raised(name: str) -> None:
    v = parse_variant(name)
    assert isinstance(v, UnrecognisedVariant)
    assert v.reason == UNRECOGNISED and v.detail
    d = verdict(name, facts())
    assert (d.accepted, d.reason, d.rank, d.parsed) == (False, UNRECOGNISED, -1, None)


@given(st.text())
@settings(max_examples=500)
def test_parse_is_total(name: str) -> None:
    v = parse_variant(name)
    assert isinstance(v, (Variant, UnrecognisedVariant))
    assert v.name == name


@given(st.text(alphabet="torch-stableabicx1298ufmpnvy_4563ln0", max_size=40))
@settings(max_examples=500)
def test_parse_is_total_on_near_misses(name: str) -> None:
    v = parse_variant(name)
    if isinstance(v, Variant):
        # Anything that parses reparses to the same thing from its canonical spelling.
        again = parse_variant(v.canonical_name)
        assert isinstance(again, Variant)
        assert replace(again, name=name) == v


def test_parse_backend() -> None:
    assert parse_backend("cu128") == cuda(12, 8)
    assert parse_backend("rocm64") == Backend(B.ROCM, (6, 4))
    assert parse_backend("rocm714") == Backend(B.ROCM, (7, 14))
    assert parse_backend("rocm714").token == "rocm714"
    assert parse_backend("xpu20253") == Backend(B.XPU, (2025, 3))
    assert parse_backend("cann81").label == "CANN 8.1"
    assert parse_backend("cu130").token == "cu130"
    for bad in ("cuda", "cu", "npu", "CPU", "rocm", ""):
        with pytest.raises(ValueError):
            parse_backend(bad)


def test_huge_numbers_are_unrecognised_not_a_crash() -> None:
    assert isinstance(
        parse_variant("torch2" + "1" * 5000 + "-cpu-x86_64-linux"), UnrecognisedVariant
    )


@given(
    st.text(alphabet=st.sampled_from(list(" \t\u2003.0123456789+abc\u0663x")), max_size=12)
    | st.text(max_size=12)
)
@settings(max_examples=500, deadline=None)
def test_version_parsing_is_the_documented_pattern(text: str) -> None:
    """`parse_version` is hand-written (a compiled pattern cost every process 0.1 ms): it must
    take exactly what `\\s*([0-9]+(?:\\.[0-9]+)*)` takes at the start of the string."""
    import re

    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)*)", text)
    if not text.strip():
        assert parse_version(text) is None
    elif m is None:
        with pytest.raises(ValueError, match="not a version"):
            parse_version(text)
    else:
        assert parse_version(text) == tuple(int(p) for p in m.group(1).split("."))
