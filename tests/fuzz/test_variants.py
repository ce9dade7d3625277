"""Variant names, platform facts and backend.archs: parse_variant/decide never raise, facts
round-trip or fail with ValueError (their documented error), arch checks never raise."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import invariants as inv
from tests.fuzz.strategies import (
    HOSTILE_STRINGS,
    fuzz_settings,
    json_document,
    json_values,
    mutated,
)

KNOWN = [
    "torch213-cxx11-cpu-x86_64-linux",
    "torch2013-cxx98-cu128-aarch64-linux",
    "torch-stable-abi29-cu130-x86_64-linux",
    "tvm-ffi01-rocm64-x86_64-linux",
    "torch29-metal-aarch64-darwin",
    "torch-universal",
    "torch-cuda",
    "torch-npu",
    "torch213-cxx11-xpu20253-x86_64-linux",
]


@st.composite
def near_misses(draw: st.DrawFn) -> str:
    """A known name with one part replaced, dropped, repeated or padded with digits."""
    parts = draw(st.sampled_from(KNOWN)).split("-")
    i = draw(st.integers(0, len(parts) - 1))
    op = draw(st.sampled_from(["replace", "drop", "repeat", "digits", "case"]))
    if op == "replace":
        parts[i] = draw(
            st.sampled_from(["", "torch", "cu", "rocm", "x", "\u0663", *HOSTILE_STRINGS[:8]])
        )
    elif op == "drop":
        del parts[i]
    elif op == "repeat":
        parts.insert(i, parts[i])
    elif op == "digits":
        parts[i] += draw(st.sampled_from(["0", "9" * 30, "9" * 5000, "²"]))
    else:
        parts[i] = parts[i].upper()
    return "-".join(parts)


names = (
    st.sampled_from(KNOWN) | near_misses() | st.text(max_size=30) | st.sampled_from(HOSTILE_STRINGS)
)


@fuzz_settings(200)
@given(st.lists(names, max_size=6))
@example(["torch213-cxx11-cu" + "9" * 5000 + "-x86_64-linux"])
def test_variant_names(batch: list[str]) -> None:
    inv.check_variant_names(batch)


VALID_FACTS: dict[str, Any] = {
    "torch_version": "2.13",
    "cxx11_abi": True,
    "backend": {"type": "cuda", "version": "12.8", "explicit": False},
    "cpu": "x86_64",
    "os": "linux",
    "free_threaded": False,
    "python_version": "3.11.7",
    "macos_version": "",
    "tvm_ffi_version": "0.1",
    "device_capabilities": ["9.0", "gfx942"],
}
facts_docs: st.SearchStrategy[Any] = mutated(st.just(VALID_FACTS), max_mutations=4) | st.builds(
    dict,
    st.fixed_dictionaries(
        {"cpu": st.sampled_from(["x86_64", ""]), "os": st.sampled_from(["linux", "darwin"])},
        optional={
            "torch_version": st.sampled_from(["2.13", "2", "2.13.0+cu128", "9" * 5000, "x", ""]),
            "backend": st.sampled_from(["cpu", "cu130", "rocm64", "metal", "npu", "cu", "cuda"])
            | st.fixed_dictionaries(
                {},
                optional={
                    "type": st.sampled_from(["cuda", "ROCM", "cann", "bogus", ""]),
                    "version": st.sampled_from(["13.0", "12", "", "1." + "9" * 5000]),
                    "explicit": st.booleans(),
                },
            ),
            "python_version": st.sampled_from(["3.11", "3.14.0t", "", "3"]),
            "macos_version": st.sampled_from(["26", "15.4", ""]),
            "device_capabilities": st.lists(
                st.sampled_from(["9.0", "10.0a", "gfx90a:xnack+", "x"])
            ),
        },
    ),
)


@fuzz_settings(200)
@given(json_document(facts_docs | json_values), st.lists(names, max_size=4))
@example(b"[" * 100_000, [])
@example(b'{"cpu": "x86_64", "os": "linux", "python_version": " "}', [])
@example(b'{"cpu": "x86_64", "os": "l\\udc9enux"}', [])  # found by the atheris target
def test_platform_json(data: bytes, batch: list[str]) -> None:
    inv.check_platform_json(data.decode("utf-8", "surrogatepass"), batch)


@fuzz_settings(150)
@given(st.binary(max_size=200), st.lists(st.sampled_from(KNOWN), max_size=3))
def test_platform_facts_wire(data: bytes, batch: list[str]) -> None:
    inv.check_facts_proto(data, batch)


archs = st.sampled_from(["8.0", "9.0a", "10.0f", "7.5+PTX", "gfx942", "sm_90", ""]) | st.text(
    "0123456789.af+PTXgx", max_size=12
)


@fuzz_settings(200)
@given(
    st.lists(archs | st.sampled_from(HOSTILE_STRINGS[-6:]), max_size=4),
    st.sampled_from(["9.0", "8.6", "gfx942:sramecc+", "12.1", "", "9", "1" * 5000 + ".0"]) | archs,
)
@example(["1" * 5000 + ".0"], "9.0")
@example(["9.0"], "1" * 5000 + ".0")
def test_arch_compatible(arch_list: list[str], capability: str) -> None:
    inv.check_arch(arch_list, capability)
