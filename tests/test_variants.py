"""Variant grammar, acceptance and preference, checked against tables and against `kernels`.

The drift tests run the real `kernels` 0.17.2 resolver (its `_resolve_variant_for_system`, which
takes explicit facts) on the same names and facts, so a change on either side shows up here.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneld_client._convert import facts_from_proto, facts_to_proto
from kerneld_client.variants import (
    UNRECOGNISED,
    Abi,
    Backend,
    BackendType,
    Decision,
    PlatformFacts,
    UnrecognisedVariant,
    Variant,
    VariantKind,
    arch_compatible,
    best_variant,
    decide,
    device_compatible,
    parse_backend,
    parse_variant,
    summarize,
)

B = BackendType
CPU = Backend(B.CPU)


def cuda(major: int, minor: int) -> Backend:
    return Backend(B.CUDA, (major, minor))


def facts(**kw: object) -> PlatformFacts:
    """Linux x86_64, CPU torch 2.13 cxx11, CPython 3.11 unless overridden."""
    base: dict[str, object] = {
        "cpu": "x86_64",
        "os": "linux",
        "torch_version": (2, 13),
        "cxx11_abi": True,
        "backend": CPU,
        "python_version": (3, 11, 7),
    }
    base.update(kw)
    return PlatformFacts(**base)  # type: ignore[arg-type]


def accepted(names: list[str], f: PlatformFacts) -> list[str]:
    return [d.variant for d in decide(names, f) if d.accepted]


def verdict(name: str, f: PlatformFacts) -> Decision:
    (d,) = decide([name], f)
    return d


# ------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------

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
]


@pytest.mark.parametrize(("name", "expected"), PARSE_TABLE, ids=[n for n, _ in PARSE_TABLE])
def test_parse_table(name: str, expected: dict[str, object]) -> None:
    v = parse_variant(name)
    assert isinstance(v, Variant), v
    assert v.name == name
    for key, value in expected.items():
        assert getattr(v, key) == value, key


MALFORMED = [
    "",
    "torch",
    "torch-",
    "torch-foo",
    "torch-cuda-extra",
    "torch-stable",
    "torch-universal-x",
    "torch213",
    "torch213-cxx11",
    "torch213-cxx11-cpu-x86_64",
    "torch213-cxx11-cpu-x86_64-linux-extra",
    "torch213-CPU-x86_64-linux",
    "torch213-cuda-x86_64-linux",
    "torch213-cu-x86_64-linux",
    "torch213-cu1-x86_64-linux",
    "torch213-npu-x86_64-linux",
    "torchX-cpu-x86_64-linux",
    "torch2-cpu-x86_64-linux",
    "torch2१3-cpu-x86_64-linux",
    "torch-stable-abi2-cpu-x86_64-linux",
    "torch-stable-abi210",
    "tvm-ffi1-cpu-x86_64-linux",
    "tvm-ffix-cpu-x86_64-linux",
    "tvm-cpu-x86_64-linux",
    "cu128",
    "build",
    "__pycache__",
    "metadata.json",
    "Torch213-cpu-x86_64-linux",
    "torch213-cxx11-cu13a-x86_64-linux",
]


@pytest.mark.parametrize("name", MALFORMED)
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


# ------------------------------------------------------------------------------------------
# Acceptance
# ------------------------------------------------------------------------------------------

F_CPU = facts()
F_CU128 = facts(torch_version=(2, 9), backend=cuda(12, 8))
F_CU130 = facts(backend=cuda(13, 0))
F_ROCM = facts(torch_version=(2, 10), backend=Backend(B.ROCM, (6, 4)))
F_XPU = facts(torch_version=(2, 9), backend=Backend(B.XPU, (2025, 3)))
F_CANN = facts(torch_version=(2, 8), cpu="aarch64", backend=Backend(B.CANN, (8, 1)))
F_MAC = facts(
    cpu="aarch64", os="darwin", cxx11_abi=None, backend=Backend(B.METAL), macos_version=(26, 1)
)
F_OLD_MAC = replace(F_MAC, macos_version=(15, 5))
F_WIN = facts(os="windows", cxx11_abi=None, backend=cuda(12, 6))
F_NO_TORCH = facts(torch_version=None, cxx11_abi=None)
F_FT313 = facts(free_threaded=True, python_version=(3, 13, 1), backend=cuda(12, 8))
F_FT315 = facts(free_threaded=True, python_version=(3, 15, 0))
F_TVM = facts(backend=cuda(12, 8), tvm_ffi_version=(0, 1))

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
    # ROCm, XPU, CANN: exact.
    (F_ROCM, "torch210-cxx11-rocm64-x86_64-linux", True, ""),
    (F_ROCM, "torch210-cxx11-rocm63-x86_64-linux", False, "ROCm 6.3 != local ROCm 6.4"),
    (F_ROCM, "torch210-cxx11-rocm65-x86_64-linux", False, "ROCm 6.5 != local ROCm 6.4"),
    (F_ROCM, "torch210-cxx11-rocm064-x86_64-linux", True, ""),
    (F_XPU, "torch29-cxx11-xpu20253-x86_64-linux", True, ""),
    (F_XPU, "torch29-cxx11-xpu20252-x86_64-linux", False, "XPU 2025.2 != local XPU 2025.3"),
    (F_CANN, "torch28-cxx11-cann81-aarch64-linux", True, ""),
    (F_CANN, "torch28-cxx11-cann80-aarch64-linux", False, "CANN 8.0 != local CANN 8.1"),
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
    (F_CANN, "torch-npu", True, ""),
    (F_CANN, "torch-cann", False, "noarch backend cann != local backend npu"),
    (F_NO_TORCH, "torch-cpu", True, ""),
    (F_NO_TORCH, "torch-universal", True, ""),
    # Free-threaded CPython < 3.15: noarch only.
    (F_FT313, "torch213-cxx11-cu128-x86_64-linux", False, "free-threaded Python accepts only"),
    (F_FT313, "torch-stable-abi210-cu128-x86_64-linux", False, "free-threaded"),
    (F_FT313, "torch-cuda", True, ""),
    (F_FT313, "torch-universal", True, ""),
    (F_FT315, "torch213-cxx11-cpu-x86_64-linux", True, ""),
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
# Preference
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------

FRAMEWORKS = [
    "torch28",
    "torch29",
    "torch210",
    "torch213",
    "torch212-cxx11",
    "torch213-cxx11",
    "torch213-cxx98",
    "torch29-cxx11",
    "torch210-cxx11",
    "torch-stable-abi28",
    "torch-stable-abi29",
    "torch-stable-abi210",
    "torch-stable-abi213",
    "torch-stable-abi214",
    "tvm-ffi01",
    "tvm-ffi02",
]
BACKENDS = [
    "cpu",
    "cu118",
    "cu120",
    "cu126",
    "cu128",
    "cu129",
    "cu130",
    "cu131",
    "rocm63",
    "rocm64",
    "xpu20252",
    "xpu20253",
    "cann80",
    "cann81",
    "metal",
    "neuron",
    "tpu",
]
SYSTEMS = ["x86_64-linux", "aarch64-linux", "aarch64-darwin", "x86_64-windows"]
NOARCH = [f"torch-{b}" for b in ("cpu", "cuda", "rocm", "xpu", "npu", "cann", "metal", "neuron")]
ALL_NAMES = [
    *(f"{fw}-{be}-{sy}" for fw, be, sy in itertools.product(FRAMEWORKS, BACKENDS, SYSTEMS)),
    *NOARCH,
    "torch-universal",
    "torch-tpu",
    *MALFORMED,
    "torch2013-cpu-x86_64-linux",
    "torch213-rocm064-x86_64-linux",
]

BACKEND_FACTS = st.one_of(
    st.just(CPU),
    st.builds(
        Backend, st.just(B.CUDA), st.tuples(st.sampled_from([11, 12, 13]), st.integers(0, 9))
    ),
    st.builds(Backend, st.just(B.ROCM), st.tuples(st.sampled_from([6, 7]), st.integers(0, 5))),
    st.builds(Backend, st.just(B.XPU), st.tuples(st.just(2025), st.integers(0, 3))),
    st.builds(Backend, st.just(B.CANN), st.tuples(st.just(8), st.integers(0, 2))),
    st.sampled_from([Backend(B.METAL), Backend(B.NEURON), Backend(B.TPU)]),
)
FACTS = st.builds(
    PlatformFacts,
    cpu=st.sampled_from(["x86_64", "aarch64"]),
    os=st.sampled_from(["linux", "darwin", "windows"]),
    torch_version=st.one_of(st.none(), st.tuples(st.just(2), st.integers(7, 15))),
    cxx11_abi=st.one_of(st.none(), st.booleans()),
    backend=BACKEND_FACTS,
    backend_explicit=st.booleans(),
    free_threaded=st.booleans(),
    python_version=st.tuples(st.just(3), st.integers(10, 16), st.integers(0, 9)),
    macos_version=st.one_of(st.none(), st.tuples(st.integers(13, 27), st.integers(0, 5))),
    tvm_ffi_version=st.one_of(st.none(), st.tuples(st.just(0), st.integers(0, 3))),
    device_capabilities=st.lists(st.sampled_from(["8.0", "9.0", "10.0", "gfx942"]), max_size=2).map(
        tuple
    ),
)
NAME_LISTS = st.lists(st.sampled_from(ALL_NAMES), max_size=40)


@given(NAME_LISTS, FACTS, st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_ranking_is_a_total_order(names: list[str], f: PlatformFacts, rnd: random.Random) -> None:
    ds = decide(names, f)
    assert len(ds) == len(set(names))
    ranks = [d.rank for d in ds]
    n = sum(d.accepted for d in ds)
    # Accepted first with ranks 0..n-1, then the rejected with -1.
    assert ranks == [*range(n), *([-1] * (len(ds) - n))]
    assert all(d.accepted == (d.reason == "") for d in ds)
    # The order does not depend on the input order ...
    shuffled = list(names)
    rnd.shuffle(shuffled)
    assert decide(shuffled, f) == ds
    # ... and is consistent across subsets: dropping names never swaps two others.
    subset = [x for x in names if rnd.random() < 0.5]
    order = [d.variant for d in ds]
    sub = [d.variant for d in decide(subset, f)]
    assert sub == [x for x in order if x in set(subset)]


@given(FACTS)
@settings(max_examples=300, deadline=None)
def test_facts_dict_and_proto_round_trip(f: PlatformFacts) -> None:
    assert PlatformFacts.from_dict(f.to_dict()) == f
    message = facts_to_proto(f)
    assert message.HasField("cxx11_abi") == (f.cxx11_abi is not None)
    assert facts_from_proto(message) == f
    from kerneld_client._proto import kerneld_pb2

    wire = kerneld_pb2.PlatformFacts.FromString(message.SerializeToString())
    assert facts_from_proto(wire) == f


def test_proto_fields() -> None:
    f = replace(F_CU130, device_capabilities=("9.0",), tvm_ffi_version=(0, 1)).with_backend("cuda")
    m = facts_to_proto(f)
    assert (m.torch_version, m.cxx11_abi, m.cpu, m.os) == ("2.13", True, "x86_64", "linux")
    assert (m.backend.type, m.backend.version, m.backend.explicit) == ("cuda", "13.0", True)
    assert (m.python_version, m.tvm_ffi_version, list(m.device_capabilities)) == (
        "3.11.7",
        "0.1",
        ["9.0"],
    )
    from kerneld_client._convert import decision_from_proto, decision_to_proto

    for d in decide(["torch-cuda", "junk", "torch-cpu"], f):
        wire = decision_to_proto(d, cached=True)
        assert wire.cached and wire.rank == d.rank and wire.reason == d.reason
        assert decision_from_proto(wire) == d


def test_from_dict_rejects_nonsense() -> None:
    good = F_CPU.to_dict()
    cases: list[tuple[dict[str, object], str]] = [
        ({"colour": "red"}, "unknown platform fact keys"),
        ({"cpu": None}, "'cpu'"),
        ({"free_threaded": "false"}, "free_threaded"),
        ({"torch_version": "two"}, "not a version"),
        ({"cxx11_abi": "yes"}, "cxx11_abi"),
        ({"backend": {"type": "quantum"}}, "unknown backend type"),
        ({"backend": {"type": "cuda", "flavour": 1}}, "unknown backend keys"),
        ({"backend": "cu"}, "unknown backend token"),
        ({"backend": 3}, "backend must be"),
        ({"device_capabilities": "9.0"}, "device_capabilities"),
    ]
    for patch, match in cases:
        with pytest.raises(ValueError, match=match):
            PlatformFacts.from_dict({**good, **patch})
    assert PlatformFacts.from_dict({**good, "backend": "cu130"}).backend == cuda(13, 0)
    assert PlatformFacts.from_dict({**good, "backend": "cuda"}).backend == Backend(B.CUDA)
    long_version = PlatformFacts.from_dict({**good, "torch_version": "2.13.0+cu130"})
    assert long_version.torch_version == (2, 13)
    with pytest.raises(ValueError):
        Backend(B.CPU, (1, 0))


def test_empty_wire_facts_mean_noarch_only() -> None:
    from kerneld_client._proto import kerneld_pb2

    f = facts_from_proto(kerneld_pb2.PlatformFacts())
    assert (f.cpu, f.os, f.torch_version, f.backend) == ("", "", None, CPU)
    names = ["torch213-cpu-x86_64-linux", "torch-cpu", "torch-universal", "torch-cuda"]
    assert accepted(names, f) == ["torch-cpu", "torch-universal"]


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


def test_device_compatible() -> None:
    gpu = replace(F_CU130, device_capabilities=("9.0",))
    assert device_compatible("cuda", ["8.0", "9.0"], gpu)[0]
    ok, why = device_compatible("cuda", ["8.0"], gpu)
    assert not ok and "9.0" in why
    # Checked only where `kernels` checks: matching backend, known devices.
    assert device_compatible("cuda", ["8.0"], gpu.with_backend("cpu"))[0]
    assert device_compatible("cpu", ["8.0"], gpu)[0]
    assert device_compatible("cuda", ["8.0"], F_CU130)[0]
    rocm = replace(F_ROCM, device_capabilities=("gfx942",))
    assert device_compatible("rocm", ["gfx942"], rocm)[0]
    assert not device_compatible("rocm", ["gfx90a"], rocm)[0]


# ------------------------------------------------------------------------------------------
# Drift check against the real `kernels` package
# ------------------------------------------------------------------------------------------


def _kernels() -> tuple[object, object, object]:
    kv = pytest.importorskip(
        "kernels.variants", reason="kernels (the reference implementation) is not installed"
    )
    kb = pytest.importorskip("kernels.backends")
    pv = pytest.importorskip("packaging.version")
    return kv, kb, pv


def _kernels_backend(kb: object, pv: object, b: Backend) -> object:
    version = None if b.version is None else pv.Version(".".join(map(str, b.version)))  # type: ignore[attr-defined]
    cls = {
        B.CPU: "CPU",
        B.CUDA: "CUDA",
        B.ROCM: "ROCm",
        B.XPU: "XPU",
        B.CANN: "CANN",
        B.METAL: "Metal",
        B.NEURON: "Neuron",
        B.TPU: "TPU",
    }[b.type]
    return getattr(kb, cls)(version=version) if version is not None else getattr(kb, cls)()


def _kernels_category(reason: str) -> str:
    for prefix, cat in [
        ("CPU (", "cpu"),
        ("OS (", "os"),
        ("Torch version", "torch"),
        ("Torch CXX11", "abi"),
        ("Torch stable ABI", "stable"),
        ("tvm-ffi version", "tvm"),
        ("Metal kernels", "metal"),
    ]:
        if reason.startswith(prefix):
            return cat
    return "backend"


def _our_category(reason: str) -> str:
    for prefix, cat in [
        ("CPU ", "cpu"),
        ("OS ", "os"),
        ("torch ", "torch"),
        ("ABI ", "abi"),
        ("stable ABI ", "stable"),
        ("tvm-ffi ", "tvm"),
        ("Metal needs", "metal"),
    ]:
        if reason.startswith(prefix) and not (cat == "cpu" and " != local CPU" not in reason):
            return cat
    return "backend"


def assert_same_as_kernels(names: list[str], f: PlatformFacts) -> None:
    kv, kb, pv = _kernels()
    ours = decide(names, f)
    by_name = {d.variant: d for d in ours}

    def ver(t: tuple[int, ...] | None) -> object:
        return None if t is None else pv.Version(".".join(map(str, t)))  # type: ignore[attr-defined]

    # Feed `kernels` the names in our order: its sort is stable, so it returns our order
    # unchanged exactly when our order is one `kernels` allows (they differ only in ties).
    parsed: list[tuple[str, object]] = []
    unparsable: set[str] = set()
    for d in ours:
        try:
            parsed.append((d.variant, kv.parse_variant(d.variant)))  # type: ignore[attr-defined]
        except Exception:
            unparsable.add(d.variant)
    name_of = {id(obj): name for name, obj in parsed}

    def run_kernels(objs: list[object]) -> tuple[list[object], list[object]]:
        with mock.patch.object(
            kv, "_is_unsupported_free_threaded_build", lambda: f.arch_variants_unsupported
        ):
            return kv._resolve_variant_for_system(  # type: ignore[attr-defined,no-any-return]
                variants=objs,
                selected_backend=_kernels_backend(kb, pv, f.backend),
                cpu=f.cpu,
                os=f.os,
                torch_version=ver(f.torch_version),
                torch_cxx11_abi=f.cxx11_abi,
                tvm_ffi_version=ver(f.tvm_ffi_version),
                macos_version=ver(f.macos_version),
            )

    k_accepted, trace = run_kernels([obj for _, obj in parsed])
    assert [name_of[id(v)] for v in k_accepted] == [d.variant for d in ours if d.accepted], f

    # Every name `kernels` cannot parse is unrecognised here; we additionally refuse
    # `torch-<unknown>` noarch names, which `kernels` parses but can never accept.
    unrecognised = {d.variant for d in ours if d.reason == UNRECOGNISED}
    assert unparsable <= unrecognised
    rejected_type = kv.VariantRejected  # type: ignore[attr-defined]
    k_rejected = {name_of[id(t.variant)]: t.reason for t in trace if isinstance(t, rejected_type)}
    for name in unrecognised - unparsable:
        assert name in k_rejected and name.startswith("torch"), name
    # `kernels` drops arch variants from its trace on free-threaded < 3.15; we list them.
    dropped: set[str] = set()
    if f.arch_variants_unsupported:
        arch_type = kv.ArchVariant  # type: ignore[attr-defined]
        dropped = {n for n, obj in parsed if isinstance(obj, arch_type)}
        assert all("free-threaded" in by_name[n].reason for n in dropped)
    ours_rejected = {d.variant for d in ours if not d.accepted} - unparsable - dropped
    assert ours_rejected == set(k_rejected)
    # The first failing check is the same one (so the reason talks about the same fact).
    for name, reason in k_rejected.items():
        if name not in unrecognised:
            ours_reason = by_name[name].reason
            assert _our_category(ours_reason) == _kernels_category(reason), (
                name,
                ours_reason,
                reason,
            )
    # And the same accepted set and order, whatever order `kernels` is given the names in.
    k_reversed, _ = run_kernels([obj for _, obj in reversed(parsed)])
    assert sorted(name_of[id(v)] for v in k_reversed) == sorted(name_of[id(v)] for v in k_accepted)


DRIFT_FACTS = {
    "cpu-torch213-linux": F_CPU,
    "cpu-torch213-cxx98": replace(F_CPU, cxx11_abi=False),
    "cu128-torch29": F_CU128,
    "cu130-torch213-aarch64": replace(F_CU130, cpu="aarch64"),
    "cu129-tvm": facts(torch_version=(2, 9), backend=cuda(12, 9), tvm_ffi_version=(0, 1)),
    "cu130-explicit-cpu": F_CU130.with_backend("cpu"),
    "rocm64-torch210": F_ROCM,
    "xpu20253-torch29": F_XPU,
    "cann81-torch28": F_CANN,
    "metal-macos26": F_MAC,
    "metal-macos15": F_OLD_MAC,
    "metal-macos25": replace(F_MAC, macos_version=(25, 9)),
    "metal-macos26.0": replace(F_MAC, macos_version=(26,)),
    "windows-cu126": F_WIN,
    "no-torch": F_NO_TORCH,
    "no-torch-cuda": replace(F_NO_TORCH, backend=cuda(12, 8)),
    "free-threaded-313": F_FT313,
    "free-threaded-315": F_FT315,
    "neuron": facts(backend=Backend(B.NEURON)),
    "tpu": facts(backend=Backend(B.TPU)),
}


@pytest.mark.parametrize("key", list(DRIFT_FACTS))
def test_same_decisions_as_kernels(key: str) -> None:
    assert_same_as_kernels(ALL_NAMES, DRIFT_FACTS[key])


@pytest.mark.parametrize("key", ["cpu-torch213-linux", "cu128-torch29", "metal-macos26"])
def test_same_decisions_as_kernels_on_random_subsets(key: str) -> None:
    rnd = random.Random(key)
    for _ in range(30):
        assert_same_as_kernels(rnd.sample(ALL_NAMES, 25), DRIFT_FACTS[key])


FRAGMENTS = [
    "torch",
    "torch213",
    "torch29",
    "torch2013",
    "stable",
    "abi29",
    "abi213",
    "tvm",
    "ffi01",
    "ffi1",
    "cxx11",
    "cxx98",
    "cpu",
    "cu128",
    "cu130",
    "cu1",
    "rocm64",
    "xpu20253",
    "cann81",
    "metal",
    "neuron",
    "tpu",
    "npu",
    "cuda",
    "universal",
    "x86_64",
    "aarch64",
    "linux",
    "darwin",
    "windows",
    "",
]
FUZZ_NAMES = st.lists(
    st.one_of(
        st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=7).map("-".join),
        st.sampled_from(ALL_NAMES),
        st.text(max_size=12),
    ),
    max_size=20,
)


@given(FUZZ_NAMES, FACTS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_same_decisions_as_kernels(names: list[str], f: PlatformFacts) -> None:
    if f.backend.type is B.NPU:
        return
    assert_same_as_kernels(names, f)
