"""Build-variant names, acceptance and preference: one source of truth for client and daemon.

The client and the daemon must agree on which folder under `build/` a process can load, or the
fast path and the RPC path would pick different kernels. Both call `decide()` with explicit
`PlatformFacts`, so the daemon can rank variants for a process whose torch it never imports.

The rules are those of the `kernels` package 0.17.2 (see REFERENCE.md section 2); where that page
and the package differ, the package wins, so kerneld chooses the same variant `kernels` would.
Nothing here imports torch, protobuf or grpc: the protobuf conversion lives in `wire`.
"""

from __future__ import annotations

from kerneld_client.variants.choice import Decision, best_variant, decide, summarize
from kerneld_client.variants.devices import arch_compatible, device_compatible
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
