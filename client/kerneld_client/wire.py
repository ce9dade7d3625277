"""The wire format's conversions: the variant and platform types to and from their protobuf
messages (`kerneld.v1`, generated into `kerneld_client.proto`; these are in `resolve_pb2`, the
messages of a Resolve, which `kerneld_pb2` re-exports).

Public, like the generated stubs: the daemon answers in these messages and the client reads
them, so both sides convert the same way. Kept apart from `variants`, so that importing the
variant rules never imports protobuf; this module imports the rules only in the conversions that
need them (a Resolve sends the platform without them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kerneld_client.proto import resolve_pb2

if TYPE_CHECKING:
    from kerneld_client.variants import Decision, PlatformFacts

__all__ = [
    "decision_from_proto",
    "decision_to_proto",
    "facts_from_proto",
    "facts_to_proto",
    "platform_to_proto",
]


def facts_to_proto(facts: PlatformFacts) -> resolve_pb2.PlatformFacts:
    """`PlatformFacts` -> `kerneld.v1.PlatformFacts` (string versions, empty when unknown)."""
    return platform_to_proto(facts.to_dict())


def platform_to_proto(d: Mapping[str, Any]) -> resolve_pb2.PlatformFacts:
    """Facts in `PlatformFacts.to_dict()` form -> `kerneld.v1.PlatformFacts`. The client's RPC
    path sends what `platform.Platform` detected this way, without the variant rules."""
    message = resolve_pb2.PlatformFacts(
        torch_version=d["torch_version"],
        backend=resolve_pb2.Backend(
            type=d["backend"]["type"],
            version=d["backend"]["version"],
            explicit=d["backend"]["explicit"],
        ),
        cpu=d["cpu"],
        os=d["os"],
        free_threaded=d["free_threaded"],
        python_version=d["python_version"],
        macos_version=d["macos_version"],
        tvm_ffi_version=d["tvm_ffi_version"],
        device_capabilities=d["device_capabilities"],
        mlx=bool(d.get("mlx", False)),
    )
    if d["cxx11_abi"] is not None:
        message.cxx11_abi = d["cxx11_abi"]
    return message


def facts_from_proto(message: resolve_pb2.PlatformFacts) -> PlatformFacts:
    """`kerneld.v1.PlatformFacts` -> `PlatformFacts`; ValueError for facts that make no sense."""
    from kerneld_client.variants import PlatformFacts

    data: dict[str, Any] = {
        "torch_version": message.torch_version,
        "cxx11_abi": message.cxx11_abi if message.HasField("cxx11_abi") else None,
        "cpu": message.cpu,
        "os": message.os,
        "free_threaded": message.free_threaded,
        "python_version": message.python_version,
        "macos_version": message.macos_version,
        "tvm_ffi_version": message.tvm_ffi_version,
        "device_capabilities": list(message.device_capabilities),
        "mlx": message.mlx,
    }
    if message.HasField("backend"):
        data["backend"] = {
            "type": message.backend.type,
            "version": message.backend.version,
            "explicit": message.backend.explicit,
        }
    return PlatformFacts.from_dict(data)


def decision_to_proto(decision: Decision, *, cached: bool = False) -> resolve_pb2.VariantDecision:
    """`Decision` -> `kerneld.v1.VariantDecision`; `cached` is the daemon's store knowledge."""
    return resolve_pb2.VariantDecision(
        variant=decision.variant,
        accepted=decision.accepted,
        reason=decision.reason,
        rank=decision.rank,
        cached=cached,
    )


def decision_from_proto(message: resolve_pb2.VariantDecision) -> Decision:
    """`kerneld.v1.VariantDecision` -> `Decision` (the `cached` flag is not part of it)."""
    from kerneld_client.variants import Decision, Variant, parse_variant

    parsed = parse_variant(message.variant)
    return Decision(
        variant=message.variant,
        accepted=message.accepted,
        reason=message.reason,
        rank=message.rank,
        parsed=parsed if isinstance(parsed, Variant) else None,
    )
