"""Build-variant names, acceptance and preference: one source of truth for client and daemon.

The client and the daemon must agree on which folder under `build/` a process can load, or the
fast path and the RPC path would pick different kernels. Both call `decide()` with explicit
`PlatformFacts`, so the daemon can rank variants for a process whose torch it never imports.

The rules are those of the newest `kernels` release, 0.19.1: its verdicts and its preference
for every name, legacy, new-format, SDK and MLX (`choice`); where a page and the package
differ, the package wins, so kerneld chooses the same variant `kernels` would.
Nothing here imports torch, protobuf or grpc: the protobuf conversion lives in `wire`.

Nothing is imported with the package itself: each name is imported from its submodule on first
use, so a process that only needs `versions` or `fingerprints` (a warm load) never pays for the
enums and dataclasses of the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "UNRECOGNISED",
    "Abi",
    "Backend",
    "BackendType",
    "Decision",
    "PlatformFacts",
    "PythonAbi",
    "UnrecognisedVariant",
    "Variant",
    "VariantKind",
    "arch_compatible",
    "best_variant",
    "decide",
    "device_compatible",
    "fingerprint",
    "parse_backend",
    "parse_variant",
    "parse_version",
    "summarize",
]

if TYPE_CHECKING:
    from kerneld_client.variants.choice import Decision, best_variant, decide, summarize
    from kerneld_client.variants.devices import arch_compatible, device_compatible
    from kerneld_client.variants.facts import PlatformFacts
    from kerneld_client.variants.fingerprints import fingerprint
    from kerneld_client.variants.names import (
        UNRECOGNISED,
        Abi,
        Backend,
        BackendType,
        PythonAbi,
        UnrecognisedVariant,
        Variant,
        VariantKind,
        parse_backend,
        parse_variant,
    )
    from kerneld_client.variants.versions import parse_version

#: Which submodule defines each public name; a name is imported on first use.
_WHERE = {
    "Decision": "choice",
    "best_variant": "choice",
    "decide": "choice",
    "summarize": "choice",
    "arch_compatible": "devices",
    "device_compatible": "devices",
    "PlatformFacts": "facts",
    "fingerprint": "fingerprints",
    "UNRECOGNISED": "names",
    "Abi": "names",
    "Backend": "names",
    "BackendType": "names",
    "PythonAbi": "names",
    "UnrecognisedVariant": "names",
    "Variant": "names",
    "VariantKind": "names",
    "parse_backend": "names",
    "parse_variant": "names",
    "parse_version": "versions",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
