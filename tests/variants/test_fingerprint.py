"""The platform fingerprint the published picks are keyed by: platforms with one fingerprint
must get the same verdict on every variant, or a warm load would take another platform's pick."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld_client.variants import Backend, PlatformFacts, best_variant, decide, fingerprint
from tests.variants.support import (
    BACKEND_FACTS,
    EVERY_NAME,
    F_CPU,
    F_CU130,
    F_FT313,
    F_MAC,
    FACTS,
    B,
)

# Local ROCm versions around a `rocm63` build: older, equal, newer minor, next major.
ROCM_VERSIONS = [(6, 2), (6, 3), (6, 4), (7, 0)]

# Replacement values for any field: some change what `decide` reads, some do not.
OVERRIDES = st.fixed_dictionaries(
    {},
    optional={
        "cpu": st.sampled_from(["x86_64", "aarch64", "x86-64"]),
        "os": st.sampled_from(["linux", "darwin"]),
        "torch_version": st.one_of(st.none(), st.tuples(st.just(2), st.integers(7, 15))),
        "cxx11_abi": st.one_of(st.none(), st.booleans()),
        "backend": BACKEND_FACTS,
        "backend_explicit": st.booleans(),
        "free_threaded": st.booleans(),
        "python_version": st.tuples(st.just(3), st.integers(10, 16), st.integers(0, 9)),
        "macos_version": st.one_of(st.none(), st.tuples(st.integers(13, 27), st.integers(0, 5))),
        "tvm_ffi_version": st.one_of(st.none(), st.tuples(st.just(0), st.integers(0, 3))),
        "device_capabilities": st.lists(st.sampled_from(["8.0", "9.0", "gfx942"])).map(tuple),
        "mlx": st.booleans(),
    },
)


def _verdicts(f: PlatformFacts) -> list[tuple[str, bool]]:
    return [(d.variant, d.accepted) for d in decide(EVERY_NAME, f)]


@given(FACTS, OVERRIDES)
@settings(max_examples=150, deadline=None)
def test_one_fingerprint_one_verdict(f: PlatformFacts, overrides: dict[str, Any]) -> None:
    """Change any facts: where the fingerprint stays the same, so does every verdict and the
    order (a fact `decide` reads but the fingerprint leaves out fails here)."""
    g = replace(f, **overrides)
    if fingerprint(f.to_dict()) == fingerprint(g.to_dict()):
        assert _verdicts(f) == _verdicts(g)


def test_what_choice_does_not_read_is_left_out() -> None:
    base = fingerprint(F_CU130.to_dict())
    assert base == "torch2.13-cxx11-cuda13.0-x86_64-linux-py3.11"
    same = replace(F_CU130, device_capabilities=("9.0",), python_version=(3, 11, 9))
    assert fingerprint(same.to_dict()) == base
    assert fingerprint(replace(F_CU130, backend_explicit=True).to_dict()) == base
    assert fingerprint(F_CPU.to_dict()) != base


def test_what_new_names_read_is_in() -> None:
    """A new-format name's `cpython-3.12` is a minimum Python, and `mlx-metal` needs MLX: the
    Python minor and MLX are facts `decide` reads, so they are in the fingerprint."""
    base = fingerprint(F_CU130.to_dict())
    newer = replace(F_CU130, python_version=(3, 12, 0))
    assert fingerprint(newer.to_dict()) == base.replace("py3.11", "py3.12")
    name = "torch-2.13-cxx11-cuda-13.0-cpython-3.12-abi3-x86_64-linux"
    assert [d.accepted for d in decide([name], F_CU130)] == [False]
    assert [d.accepted for d in decide([name], newer)] == [True]
    mlx = replace(F_MAC, mlx=True)
    assert fingerprint(mlx.to_dict()) == fingerprint(F_MAC.to_dict()) + "-mlx"
    assert [d.accepted for d in decide(["mlx-metal"], mlx)] == [True]
    assert [d.accepted for d in decide(["mlx-metal"], F_MAC)] == [False]


def test_what_legacy_verdicts_read_is_in() -> None:
    """kerneld judges legacy names as `kernels` 0.19.1 does, which reads facts there that 0.17.2
    did not: whether Python is free-threaded at 3.15+ (abi3 never loads), the local ROCm minor
    (an older one loads) and CANN (`torch-cann`, not `torch-npu`). Each is in the fingerprint,
    so a warm load never takes the pick of a platform that differs there."""
    gil = replace(F_CPU, python_version=(3, 15, 0))
    ft = replace(gil, free_threaded=True)
    assert fingerprint(ft.to_dict()) == fingerprint(gil.to_dict()) + "t"
    legacy = "torch213-cxx11-cpu-x86_64-linux"
    assert [d.accepted for d in decide([legacy], gil)] == [True]
    assert [d.accepted for d in decide([legacy], ft)] == [False]

    rocm63 = "torch210-cxx11-rocm63-x86_64-linux"
    rocm = [
        replace(F_CPU, torch_version=(2, 10), backend=Backend(B.ROCM, v)) for v in ROCM_VERSIONS
    ]
    assert len({fingerprint(f.to_dict()) for f in rocm}) == len(ROCM_VERSIONS)
    assert [decide([rocm63], f)[0].accepted for f in rocm] == [False, True, True, False]

    cann = replace(F_CPU, torch_version=(2, 8), backend=Backend(B.CANN, (8, 1)))
    assert "-cann8.1-" in fingerprint(cann.to_dict())
    assert best_variant(["torch-npu", "torch-cann"], cann) == "torch-cann"


def test_readable_and_unambiguous() -> None:
    assert fingerprint(F_FT313.to_dict()).endswith("-py3.13t")
    assert "-macos26" in fingerprint(F_MAC.to_dict())
    # A hyphen inside a fact cannot shift the fields after it.
    a = replace(F_CPU, cpu="x86-64", os="linux")
    b = replace(F_CPU, cpu="x86", os="64-linux")
    assert fingerprint(a.to_dict()) != fingerprint(b.to_dict())


def test_malformed_facts_are_a_value_error() -> None:
    import pytest

    with pytest.raises(ValueError, match="not platform facts"):
        fingerprint({"cpu": "x86_64"})
