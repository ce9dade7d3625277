"""Acceptance and preference: which variants a process can load, and the best of them.

The rules of the `kernels` package 0.17.2, so kerneld picks the folder `kernels` would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kerneld_client.variants.facts import PlatformFacts
from kerneld_client.variants.names import (
    METAL_MIN_MACOS,
    UNRECOGNISED,
    Abi,
    BackendType,
    UnrecognisedVariant,
    Variant,
    VariantKind,
    parse_variant,
)
from kerneld_client.variants.versions import dotted


@dataclass(frozen=True)
class Decision:
    """The verdict on one variant: `rank` 0 is the best accepted one, -1 means rejected."""

    variant: str
    accepted: bool
    reason: str
    rank: int
    parsed: Variant | None = None


def _missing(what: str, version: tuple[int, int], tool: str) -> str:
    return f"{what} {dotted(version)} needs {tool}, which is not installed"


def _reject_reason(v: Variant, facts: PlatformFacts) -> str | None:
    """Why `v` cannot be loaded with `facts`, or None; checks in the order `kernels` does."""
    local = facts.backend
    if not v.is_arch:
        if v.kind is VariantKind.UNIVERSAL:
            return None
        assert v.backend is not None
        if v.backend.type.value != local.noarch_name:
            return f"noarch backend {v.backend.type.value} != local backend {local.noarch_name}"
        return None

    assert v.backend is not None
    if facts.arch_variants_unsupported:
        return "free-threaded Python accepts only noarch variants"
    if v.cpu != facts.cpu:
        return f"CPU {v.cpu} != local CPU {facts.cpu}"
    if v.os != facts.os:
        return f"OS {v.os} != local OS {facts.os}"
    if v.kind is VariantKind.TORCH_ARCH:
        assert v.torch_version is not None
        if facts.torch_version is None:
            return _missing("torch", v.torch_version, "torch")
        if v.torch_version != facts.torch_version:
            return f"torch {dotted(v.torch_version)} != local torch {dotted(facts.torch_version)}"
        if v.abi is not Abi.NONE and (v.abi is Abi.CXX11) is not facts.cxx11_abi:
            local_abi = {True: "cxx11", False: "cxx98", None: "none"}[facts.cxx11_abi]
            return f"ABI {v.abi.value} != local {local_abi}"
    elif v.kind is VariantKind.STABLE_ABI:
        assert v.torch_version is not None
        if facts.torch_version is None:
            return _missing("stable ABI", v.torch_version, "torch")
        if v.torch_version > facts.torch_version:
            return (
                f"stable ABI {dotted(v.torch_version)} is newer than the local torch "
                f"{dotted(facts.torch_version)}"
            )
    else:
        assert v.tvm_ffi_version is not None
        if facts.tvm_ffi_version is None:
            return _missing("tvm-ffi", v.tvm_ffi_version, "tvm-ffi")
        if v.tvm_ffi_version != facts.tvm_ffi_version:
            local_ffi = dotted(facts.tvm_ffi_version)
            return f"tvm-ffi {dotted(v.tvm_ffi_version)} != local tvm-ffi {local_ffi}"

    if local.type is BackendType.CUDA and v.backend.type is BackendType.CUDA:
        assert v.backend.version is not None
        if local.version is None:
            return f"{v.backend.label} cannot be checked: the local CUDA version is unknown"
        if v.backend.version[0] != local.version[0]:
            return f"{v.backend.label} has another major version than the local {local.label}"
        if v.backend.version[1] > local.version[1]:
            return f"{v.backend.label} is newer than the local {local.label}"
        return None
    # Token equality, as in `kernels` (so `rocm710` matches a local ROCm 7.10).
    if v.backend.token != local.token:
        return f"{v.backend.label} != local {local.label}"
    if v.backend.type is BackendType.METAL and (
        facts.macos_version is None or facts.macos_version[0] < METAL_MIN_MACOS
    ):
        local_mac = dotted(facts.macos_version) or "unknown"
        return f"Metal needs macOS >= {METAL_MIN_MACOS} (local macOS: {local_mac})"
    return None


_RANKED_BACKENDS = (BackendType.CUDA, BackendType.ROCM, BackendType.XPU, BackendType.CANN)


def _preference(v: Variant) -> tuple[int, int, int, int, int]:
    """Sort key, best first. The first four fields are the key of `kernels`' `_sort_variants`;
    the fifth breaks its one tie (a tvm-ffi variant vs. noarch) in favour of tvm-ffi."""
    if not v.is_arch:
        return (2, 0, 0, 1 if v.kind is VariantKind.UNIVERSAL else 0, 1)
    assert v.backend is not None
    if v.kind is VariantKind.STABLE_ABI:
        assert v.torch_version is not None
        head = (0, -v.torch_version[0], -v.torch_version[1])
    elif v.kind is VariantKind.TORCH_ARCH:
        head = (1, 0, 1 if v.abi is not Abi.NONE else 0)
    else:
        head = (2, 0, 0)
    minor = 0
    if v.backend.type in _RANKED_BACKENDS and v.backend.version is not None:
        minor = -v.backend.version[1]
    return (*head, minor, 0)


def _order(
    item: tuple[str, Variant | UnrecognisedVariant, str | None],
) -> tuple[int, tuple[int, ...], bool, str]:
    name, parsed, reason = item
    if isinstance(parsed, UnrecognisedVariant):
        return (2, (), False, name)
    return (0 if reason is None else 1, _preference(parsed), name != parsed.canonical_name, name)


def decide(variants: Iterable[str], facts: PlatformFacts) -> list[Decision]:
    """Judge every variant name for `facts`: accepted ones best first (rank 0, 1, ...), then
    the rejected ones (rank -1) with their reasons. Duplicate names are judged once."""
    items: list[tuple[str, Variant | UnrecognisedVariant, str | None]] = []
    for name in dict.fromkeys(variants):
        parsed = parse_variant(name)
        reason = UNRECOGNISED if isinstance(parsed, UnrecognisedVariant) else None
        if reason is None:
            assert isinstance(parsed, Variant)
            reason = _reject_reason(parsed, facts)
        items.append((name, parsed, reason))
    items.sort(key=_order)
    decisions: list[Decision] = []
    rank = 0
    for name, parsed, reason in items:
        variant = parsed if isinstance(parsed, Variant) else None
        if reason is None:
            decisions.append(Decision(name, True, "", rank, variant))
            rank += 1
        else:
            decisions.append(Decision(name, False, reason, -1, variant))
    return decisions


def best_variant(variants: Iterable[str], facts: PlatformFacts) -> str | None:
    """The name of the preferred accepted variant, or None when none fits."""
    for decision in decide(variants, facts):
        return decision.variant if decision.accepted else None
    return None


def summarize(decisions: Sequence[Decision], facts: PlatformFacts | None = None) -> str:
    """Multi-line verdict list for `NoCompatibleVariant` and `kerneldctl info`."""
    lines = []
    if facts is not None:
        lines.append(f"platform: {facts.describe()}")
    if not decisions:
        lines.append("(the revision has no build variants)")
    for d in decisions:
        if d.accepted:
            lines.append(f"{d.variant}: accepted" + (" (preferred)" if d.rank == 0 else ""))
        else:
            lines.append(f"{d.variant}: rejected: {d.reason}")
    return "\n".join(lines)
