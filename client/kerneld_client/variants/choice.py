"""Acceptance and preference: which variants a process can load, and the best of them.

The rules of the newest `kernels` release, 0.19.1, for every name, legacy and new-format
alike, so kerneld picks the folder `kernels` would. Its preference orders the legacy names as
0.17.2 does; its verdicts on legacy names differ from 0.17.2's in a few places where 0.19.1
changed the rules (docs/kernels-compatibility.md, "Build variants"), and kerneld follows 0.19.1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kerneld_client.variants.facts import PlatformFacts
from kerneld_client.variants.names import (
    METAL_MIN_MACOS,
    UNRECOGNISED,
    Abi,
    Backend,
    BackendType,
    PythonAbi,
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


def _python_reason(v: Variant, facts: PlatformFacts) -> str | None:
    """0.19.1's `_python_mismatch`: abi3 never loads on free-threaded CPython (a legacy arch
    name is implicitly `cpython-3.9-abi3`), and the name's `cpython-M.m` is a minimum."""
    if v.python_min is None:
        return None
    if v.python_abi is PythonAbi.ABI3 and facts.free_threaded:
        if v.legacy:
            return (
                "Python abi3 (every legacy arch name) cannot load on free-threaded Python: "
                "use a GIL-enabled Python or a build named ...-cpython-3.15-abi3t-..."
            )
        return "Python abi3 cannot load on free-threaded Python (abi3t is needed)"
    if facts.python_version[:2] < v.python_min:
        local = dotted(facts.python_version[:2])
        return f"Python {dotted(v.python_min)} or later needed, local Python is {local}"
    return None


def _system_reason(v: Variant, facts: PlatformFacts) -> str | None:
    if v.cpu != facts.cpu:
        return f"CPU {v.cpu} != local CPU {facts.cpu}"
    if v.os != facts.os:
        return f"OS {v.os} != local OS {facts.os}"
    return None


def _framework_reason(v: Variant, facts: PlatformFacts) -> str | None:
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
    elif v.kind is VariantKind.TVM_FFI:
        assert v.tvm_ffi_version is not None
        if facts.tvm_ffi_version is None:
            return _missing("tvm-ffi", v.tvm_ffi_version, "tvm-ffi")
        if v.tvm_ffi_version != facts.tvm_ffi_version:
            local_ffi = dotted(facts.tvm_ffi_version)
            return f"tvm-ffi {dotted(v.tvm_ffi_version)} != local tvm-ffi {local_ffi}"
    return None


def _minor_compatible(backend: Backend, local: Backend) -> str | None:
    """Same major, minor <= local (CUDA and ROCm). A legacy token is read with its minor the
    last digit, as `kernels` does: `rocm714` is ROCm 71.4, never a local 7.14."""
    assert backend.version is not None
    if local.version is None:
        return f"{backend.label} cannot be checked against the local {local.label}"
    if backend.version[0] != local.version[0]:
        return f"{backend.label} has another major version than the local {local.label}"
    if backend.version[1] > local.version[1]:
        return f"{backend.label} is newer than the local {local.label}"
    return None


def _metal_reason(facts: PlatformFacts) -> str | None:
    if facts.macos_version is None or facts.macos_version[0] < METAL_MIN_MACOS:
        local_mac = dotted(facts.macos_version) or "unknown"
        return f"Metal needs macOS >= {METAL_MIN_MACOS} (local macOS: {local_mac})"
    return None


_MINOR_COMPATIBLE = (BackendType.CUDA, BackendType.ROCM)


def _backend_reason(backend: Backend, facts: PlatformFacts) -> str | None:
    """0.19.1's `_backend_mismatch`, for legacy and new names alike: CUDA and ROCm accept the
    same major and an older or equal minor; the others (XPU, CANN, ...) their backend and
    version exactly, compared as versions (0.17.2 compared spellings: `cann810` matched a local
    CANN 8.10, where 0.19.1 reads it as CANN 81.0)."""
    local = facts.backend
    if backend.type is local.type and local.type in _MINOR_COMPATIBLE:
        return _minor_compatible(backend, local)
    if backend != local:
        return f"{backend.label} != local {local.label}"
    if backend.type is BackendType.METAL:
        return _metal_reason(facts)
    return None


def _arch_reason(v: Variant, facts: PlatformFacts) -> str | None:
    """An arch name, legacy or new, with the checks of 0.19.1 in its order."""
    assert v.backend is not None
    reason = _python_reason(v, facts) or _system_reason(v, facts) or _framework_reason(v, facts)
    return reason or _backend_reason(v.backend, facts)


def _sdk_reason(v: Variant, facts: PlatformFacts) -> str | None:
    """An SDK build (0.19.1): Python and system when compiled, then its backend if it names one
    (by name alone when nothing is compiled)."""
    reason = _python_reason(v, facts)
    if reason is None and v.compiled:
        reason = _system_reason(v, facts)
    if reason is None and v.backend is not None:
        if not v.compiled:
            if v.backend.type is not facts.backend.type:
                local = facts.backend.type.value
                return f"SDK backend {v.backend.type.value} != local backend {local}"
        else:
            reason = _backend_reason(v.backend, facts)
    return reason


def _reject_reason(v: Variant, facts: PlatformFacts) -> str | None:
    """Why `v` cannot be loaded with `facts`, or None; checks in the order `kernels` does."""
    local = facts.backend
    if v.kind is VariantKind.UNIVERSAL:
        return None
    if v.kind is VariantKind.NOARCH:
        assert v.backend is not None
        if v.backend.type is not local.type:
            reason = f"noarch backend {v.backend.type.value} != local backend {local.type.value}"
            if v.backend.type is BackendType.NPU and local.type is BackendType.CANN:
                reason += " (kernels >= 0.19 loads torch-cann on CANN; torch-npu was its old name)"
            return reason
        return None
    if v.kind is VariantKind.MLX_NOARCH:
        if not facts.mlx:
            return "MLX noarch variant, but MLX is not installed"
        if v.backend is not None and v.backend.type is not local.type:
            return f"noarch backend {v.backend.type.value} != local backend {local.type.value}"
        return None
    if v.kind is VariantKind.SDK:
        return _sdk_reason(v, facts)
    return _arch_reason(v, facts)


_RANKED_BACKENDS = (BackendType.CUDA, BackendType.ROCM, BackendType.XPU, BackendType.CANN)


def _backend_order(backend: Backend | None) -> int:
    """Higher backend minor first (`kernels` ranks by the minor alone)."""
    if backend is not None and backend.type in _RANKED_BACKENDS and backend.version is not None:
        return -backend.version[1]
    return 0


def _python_order(v: Variant) -> tuple[int, int, int]:
    """abi3 before abi3t, then the higher minimum Python first (as wheel tags)."""
    assert v.python_min is not None
    return (0 if v.python_abi is PythonAbi.ABI3 else 1, -v.python_min[0], -v.python_min[1])


def _preference(v: Variant) -> tuple[int, ...]:
    """Sort key, best first: the key of `kernels` 0.19.1's `_sort_variants` less its accepted
    flag. Stable ABI (newest first), torch arch (untagged first), tvm-ffi, compiled SDKs, noarch
    (`universal` last), SDKs for a backend, bare `sdk`; backend minor and Python break ties."""
    if v.is_arch:
        if v.kind is VariantKind.STABLE_ABI:
            assert v.torch_version is not None
            head = (0, -v.torch_version[0], -v.torch_version[1])
        elif v.kind is VariantKind.TORCH_ARCH:
            head = (1, 0, 1 if v.abi is not Abi.NONE else 0)
        else:
            head = (2, 0, 0)
        return (*head, _backend_order(v.backend), *_python_order(v))
    if v.kind is VariantKind.SDK:
        if v.compiled:
            backend = 1 if v.backend is None else _backend_order(v.backend)
            return (3, 0, 0, backend, *_python_order(v))
        return (5 if v.backend is not None else 6, 0, 0, 0, 0, 0, 0)
    universal = v.backend is None  # torch-universal, mlx-universal
    return (4, 0, 0, 1 if universal else 0, 0, 0)


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
