"""Our variant decisions against `kernels`': the same names accepted, in an order it allows, and
rejected for the same first failing fact.

The drift tests run the real resolvers of `kernels` 0.17.2 and 0.19.1 (their
`_resolve_variant_for_system`, which takes explicit facts), each in its own clean venv
(release_resolvers.py), on the same names and facts, so a change on either side shows up here.
Every name is judged as 0.19.1, the newest release, judges it, with no exception. Legacy names
get 0.17.2's verdicts too, except where 0.19.1 changed the rules for them (a ROCm build with an
older minor, abi3 on free-threaded Python 3.15+, `torch-cann` for `torch-npu` on CANN, and
backend versions compared as versions, not spellings): these tests check that each difference
from 0.17.2 is one of those, and that the corpus shows each.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneld_client.variants import (
    UNRECOGNISED,
    Backend,
    PlatformFacts,
    Variant,
    decide,
    parse_variant,
)
from tests.variants.release_resolvers import ReleaseResolver
from tests.variants.support import (
    ALL_NAMES,
    EVERY_NAME,
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

Resolvers = dict[str, ReleaseResolver]

_KERNELS_CATEGORIES = [
    ("CPU (", "cpu"),
    ("OS (", "os"),
    ("Torch version", "torch"),
    ("Torch CXX11", "abi"),
    ("Torch stable ABI", "stable"),
    ("tvm-ffi version", "tvm"),
    ("Metal kernels", "metal"),
    ("arch kernel not supported on free-threaded", "python"),
    ("abi3 is not supported", "python"),
    ("Python ", "python"),
    ("MLX is not installed", "mlx"),
]
_OUR_CATEGORIES = [
    ("CPU ", "cpu"),
    ("OS ", "os"),
    ("torch ", "torch"),
    ("ABI ", "abi"),
    ("stable ABI ", "stable"),
    ("tvm-ffi ", "tvm"),
    ("Metal needs", "metal"),
    ("free-threaded Python", "python"),
    ("Python ", "python"),
    ("MLX ", "mlx"),
]


def _kernels_category(reason: str) -> str:
    return next(
        (cat for prefix, cat in _KERNELS_CATEGORIES if reason.startswith(prefix)), "backend"
    )


def _our_category(reason: str) -> str:
    for prefix, cat in _OUR_CATEGORIES:
        # "CPU != local CUDA 12.8" is a backend reason (the label of the CPU backend).
        if reason.startswith(prefix) and not (cat == "cpu" and " != local CPU" not in reason):
            return cat
    return "backend"


def _is_legacy(name: str) -> bool:
    parsed = parse_variant(name)
    return isinstance(parsed, Variant) and parsed.legacy


def compare(
    resolver: ReleaseResolver,
    names: list[str],
    f: PlatformFacts,
    reference: dict[str, Any] | None = None,
) -> set[str]:
    """Assert that we decide `names` as `resolver` does; the names where we follow
    `reference`'s verdict instead (legacy names only, with `reference`, 0.19.1's answer when
    `resolver` is 0.17.2's) are returned."""
    ours = decide(names, f)
    by_name = {d.variant: d for d in ours}
    # Feed `kernels` the names in our order: its sort is stable, so it returns our order
    # unchanged exactly when our order is one `kernels` allows (they differ only in ties).
    k = resolver.judge([d.variant for d in ours], f.to_dict())
    unparsable, dropped = set(k["unparsable"]), set(k["dropped"])
    # Every name `kernels` cannot parse is unrecognised here; we additionally refuse names it
    # parses with a free-form backend (`torch-foo`, `mlx-foo`, `sdk-foo`) but never accepts.
    unrecognised = {d.variant for d in ours if d.reason == UNRECOGNISED}
    assert unparsable <= unrecognised, (resolver.release, unparsable - unrecognised)
    for name in unrecognised - unparsable:
        assert name in k["rejected"], (resolver.release, name, f)
        assert name.split("-")[0] in ("torch", "mlx", "sdk"), name

    ours_accepted = {d.variant for d in ours if d.accepted}
    k_accepted = set(k["accepted"])
    followed_reference: set[str] = set()
    for name in ours_accepted ^ k_accepted:
        followed = reference is not None and _is_legacy(name)
        if followed:
            assert reference is not None
            followed = (name in reference["accepted"]) == (name in ours_accepted)
        assert followed, (resolver.release, name, by_name[name].reason, k["rejected"].get(name), f)
        followed_reference.add(name)
    # The accepted names both accept come in the same order.
    both = ours_accepted & k_accepted
    assert [n for n in k["accepted"] if n in both] == [
        d.variant for d in ours if d.variant in both
    ], (resolver.release, f)
    assert sorted(k["accepted_reversed"]) == sorted(k["accepted"])
    # `kernels` 0.17.2 drops arch variants from its trace on free-threaded < 3.15; we list them.
    if dropped:
        assert f.free_threaded and f.python_version[:2] < (3, 15)
        assert all("free-threaded" in by_name[n].reason for n in dropped)
    # The first failing check is the same one (so the reason talks about the same fact); for a
    # legacy name where we follow the reference's rules, the reference's first failing check.
    for name, reason in k["rejected"].items():
        if name in unrecognised or name in followed_reference:
            continue
        ours_cat = _our_category(by_name[name].reason)
        allowed = {_kernels_category(reason)}
        if reference is not None and _is_legacy(name) and name in reference["rejected"]:
            allowed.add(_kernels_category(reference["rejected"][name]))
        assert ours_cat in allowed, (resolver.release, name, by_name[name].reason, reason)
    ours_rejected = {d.variant for d in ours if not d.accepted} - unparsable - dropped
    assert ours_rejected - followed_reference == set(k["rejected"]) - followed_reference
    return followed_reference


def compare_both(resolvers: Resolvers, names: list[str], f: PlatformFacts) -> set[str]:
    """Every name exactly as 0.19.1; the legacy names as 0.17.2 but where 0.19.1 differs from
    it (those names are returned)."""
    assert not compare(resolvers["0.19.1"], names, f)
    legacy = [n for n in names if n in set(ALL_NAMES) or _is_legacy(n)]
    reference = resolvers["0.19.1"].judge(legacy, f.to_dict())
    differs = compare(resolvers["0.17.2"], legacy, f, reference)
    for name in differs:
        assert _why_0191_differs_from_0172(name, f) is not None, (name, f)
    return differs


F_PY312 = facts(python_version=(3, 12, 4), backend=cuda(12, 8))
F_ROCM714 = facts(torch_version=(2, 10), backend=Backend(B.ROCM, (7, 14)))
DRIFT_FACTS = {
    "cpu-torch213-linux": F_CPU,
    "cpu-torch213-cxx98": replace(F_CPU, cxx11_abi=False),
    "cpu-torch213-py39": replace(F_CPU, python_version=(3, 9, 0)),
    "cu128-torch29": F_CU128,
    "cu128-torch213-py312": F_PY312,
    "cu130-torch213-aarch64": replace(F_CU130, cpu="aarch64"),
    "cu129-tvm": facts(torch_version=(2, 9), backend=cuda(12, 9), tvm_ffi_version=(0, 1)),
    "cu130-explicit-cpu": F_CU130.with_backend("cpu"),
    "rocm64-torch210": F_ROCM,
    "rocm714-torch210": F_ROCM714,
    "xpu20253-torch29": F_XPU,
    "xpu202510-torch29": replace(F_XPU, backend=Backend(B.XPU, (2025, 10))),
    "cann81-torch28": F_CANN,
    "cann810-torch28": replace(F_CANN, backend=Backend(B.CANN, (8, 10))),
    "metal-macos26": F_MAC,
    "metal-macos26-mlx": replace(F_MAC, mlx=True),
    "metal-macos15": F_OLD_MAC,
    "metal-macos25": replace(F_MAC, macos_version=(25, 9)),
    "metal-macos26.0": replace(F_MAC, macos_version=(26,)),
    "windows-cu126": F_WIN,
    "no-torch": F_NO_TORCH,
    "no-torch-cuda": replace(F_NO_TORCH, backend=cuda(12, 8)),
    "no-torch-mlx-metal": replace(F_NO_TORCH, backend=Backend(B.METAL), mlx=True),
    "cpu-mlx": replace(F_CPU, mlx=True),
    "free-threaded-313": F_FT313,
    "free-threaded-315": F_FT315,
    "free-threaded-316-cu130": replace(F_FT315, python_version=(3, 16, 0), backend=cuda(13, 0)),
    "py315-gil": replace(F_CPU, python_version=(3, 15, 1)),
    "neuron": facts(backend=Backend(B.NEURON)),
    "tpu": facts(backend=Backend(B.TPU)),
}


def test_release_venvs_hold_only_the_release(release_resolvers: Resolvers) -> None:
    """Neither kerneld nor the project's site-packages can answer for `kernels`."""
    import sysconfig
    from pathlib import Path

    project = {sysconfig.get_paths()["purelib"], str(Path(__file__).resolve().parents[2])}
    for release, resolver in release_resolvers.items():
        assert resolver.release == release
        seen = resolver.isolation
        assert not seen["kerneld"] and not seen["kerneld_client"], release
        assert not seen["torch"] and not seen["transformers"], release
        assert not project & set(seen["sys_path"]), (release, seen["sys_path"])
    # 0.17.2 requires sigstore; in 0.19.1 it is the optional extra `[sigstore]`.
    assert release_resolvers["0.17.2"].isolation["sigstore"]
    assert not release_resolvers["0.19.1"].isolation["sigstore"]


@pytest.mark.parametrize("key", list(DRIFT_FACTS))
def test_same_decisions_as_kernels(release_resolvers: Resolvers, key: str) -> None:
    compare_both(release_resolvers, EVERY_NAME, DRIFT_FACTS[key])


def _why_0191_differs_from_0172(name: str, f: PlatformFacts) -> str | None:
    """Which of 0.19.1's rule changes makes it judge the legacy `name` otherwise than 0.17.2 on
    `f`, or None when none applies."""
    parsed = parse_variant(name)
    if not (isinstance(parsed, Variant) and parsed.legacy):
        return None
    local, backend = f.backend, parsed.backend
    if parsed.is_arch and f.free_threaded and f.python_version[:2] >= (3, 15):
        return "abi3 on free-threaded Python"  # 0.17.2 let 3.15+ load abi3; 0.19.1 never
    if name in ("torch-npu", "torch-cann") and local.type is B.CANN:
        return "CANN noarch"  # 0.17.2 loads torch-npu there, 0.19.1 torch-cann
    if not parsed.is_arch or backend is None or backend.type is not local.type:
        return None
    assert backend.version is not None and local.version is not None
    if backend.token == local.token and backend.version != local.version:
        return "spelling"  # `cann810`: 0.17.2 compared spellings, 0.19.1 reads CANN 81.0
    same_major = backend.version[0] == local.version[0]
    if local.type is B.ROCM and same_major and backend.version[1] < local.version[1]:
        return "older ROCm minor"  # 0.19.1 treats ROCm as CUDA
    return None


def test_where_we_differ_from_0172(release_resolvers: Resolvers) -> None:
    """kerneld agrees with 0.19.1 on every verdict; the legacy names where it (with 0.19.1)
    differs from 0.17.2 are exactly those 0.19.1's rule changes explain, and the corpus shows
    each change."""
    differs = {
        key: compare_both(release_resolvers, EVERY_NAME, f) for key, f in DRIFT_FACTS.items()
    }
    seen: dict[str, set[str]] = {}
    for key, names in differs.items():
        for name in names:
            why = _why_0191_differs_from_0172(name, DRIFT_FACTS[key])
            assert why is not None, (key, name)
            seen.setdefault(why, set()).add(key)
    assert seen == {
        "older ROCm minor": {"rocm64-torch210"},
        "abi3 on free-threaded Python": {"free-threaded-315", "free-threaded-316-cu130"},
        "CANN noarch": {"cann81-torch28", "cann810-torch28"},
        "spelling": {"xpu202510-torch29", "cann810-torch28"},
    }, seen
    # `rocm714` is ROCm 7.14 for 0.19.1 too (its one exception to the one-digit minor).
    assert not differs["rocm714-torch210"]
    assert not differs["cpu-torch213-linux"] and not differs["cu128-torch29"]


@pytest.mark.parametrize("key", ["cpu-torch213-linux", "cu128-torch213-py312", "metal-macos26-mlx"])
def test_same_decisions_as_kernels_on_random_subsets(
    release_resolvers: Resolvers, key: str
) -> None:
    rnd = random.Random(key)
    for _ in range(30):
        compare_both(release_resolvers, rnd.sample(EVERY_NAME, 25), DRIFT_FACTS[key])


FRAGMENTS = [
    "torch",
    "torch213",
    "torch29",
    "torch2013",
    "stable",
    "abi",
    "abi29",
    "abi213",
    "tvm",
    "ffi",
    "ffi01",
    "ffi1",
    "cxx11",
    "cxx98",
    "cpu",
    "cu128",
    "cu130",
    "cu1",
    "cuda",
    "rocm",
    "rocm64",
    "xpu20253",
    "cann81",
    "metal",
    "neuron",
    "tpu",
    "npu",
    "universal",
    "sdk",
    "mlx",
    "2.13",
    "2.9",
    "0.1",
    "12.8",
    "13.0",
    "6.4",
    "cpython",
    "3.9",
    "3.12",
    "3.15",
    "abi3",
    "abi3t",
    "x86_64",
    "aarch64",
    "linux",
    "darwin",
    "windows",
    "",
]
FUZZ_NAMES = st.lists(
    st.one_of(
        st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=9).map("-".join),
        st.sampled_from(EVERY_NAME),
        st.text(max_size=12),
    ),
    max_size=20,
)


@given(FUZZ_NAMES, FACTS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_same_decisions_as_kernels(
    release_resolvers: Resolvers, names: list[str], f: PlatformFacts
) -> None:
    compare_both(release_resolvers, names, f)
