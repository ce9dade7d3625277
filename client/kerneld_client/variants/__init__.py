"""Build-variant names, acceptance and preference: one source of truth for client and daemon.

The client and the daemon must agree on which folder under `build/` a process can load, or the
fast path and the RPC path would pick different kernels. Both call `decide()` with explicit
`PlatformFacts`, so the daemon can rank variants for a process whose torch it never imports.

The rules are those of the `kernels` package 0.17.2 (see REFERENCE.md section 2); where that page
and the package differ, the package wins, so kerneld chooses the same variant `kernels` would.
Nothing here imports torch, protobuf or grpc: the protobuf conversion lives in `wire`. The
device-architecture check (`devices`) is imported when first used: only builds that declare
architectures need it, and a warm load pays for every module it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kerneld_client.variants.choice import Decision, best_variant, decide, summarize
from kerneld_client.variants.facts import PlatformFacts, parse_version
from kerneld_client.variants.names import (
    UNRECOGNISED,
    Abi,
    Backend,
    BackendType,
    UnrecognisedVariant,
    Variant,
    VariantKind,
    parse_backend,
    parse_variant,
)

__all__ = [
    "UNRECOGNISED",
    "Abi",
    "Backend",
    "BackendType",
    "Decision",
    "PlatformFacts",
    "UnrecognisedVariant",
    "Variant",
    "VariantKind",
    "arch_compatible",
    "best_variant",
    "decide",
    "device_compatible",
    "parse_backend",
    "parse_variant",
    "parse_version",
    "summarize",
]

if TYPE_CHECKING:
    from kerneld_client.variants.devices import arch_compatible, device_compatible

_LAZY = {"arch_compatible", "device_compatible"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from kerneld_client.variants import devices

        return getattr(devices, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
