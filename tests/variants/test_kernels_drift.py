"""Our variant decisions against `kernels`': the same names accepted, in an order it allows, and
rejected for the same first failing fact.

The drift tests run the real `kernels` 0.17.2 resolver (its `_resolve_variant_for_system`, which
takes explicit facts) on the same names and facts, so a change on either side shows up here.
"""

from __future__ import annotations

import random
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneld_client.variants import (
    UNRECOGNISED,
    Backend,
    PlatformFacts,
    decide,
)
from tests.variants.support import (
    ALL_NAMES,
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
    F_WIN,
    F_XPU,
    FACTS,
    B,
    cuda,
    facts,
)


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
