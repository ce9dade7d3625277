"""`Device`, `CUDAProperties`, `ROCMProperties`: the keys of a kernel mapping.

A mapping may hold several repos for one GPU type, each for a capability interval
(`CUDAProperties(min_capability=80, max_capability=89)`); `kernelize` uses the smallest
interval that contains the current device's capability, as `kernels` does. Capabilities are
integers `major * 10 + minor` (8.6 -> 86). The device's capability comes from
`kerneld_client.platform.platform_facts()`, so tests (and hosts without the GPU attached) can
inject it with `set_platform_facts()` or `KERNELD_PLATFORM_JSON`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerneld_client.device_names import capability_number

__all__ = [
    "SUPPORTED_DEVICE_TYPES",
    "CUDAProperties",
    "Device",
    "ROCMProperties",
    "capability_number",
    "coerce_device",
]

#: Device types `kernelize` and mappings know (those of `kernels` 0.17).
SUPPORTED_DEVICE_TYPES = frozenset({"cpu", "cuda", "mps", "neuron", "npu", "rocm", "tpu", "xpu"})
#: Device types whose mapping entries may be split by capability.
CAPABILITY_DEVICE_TYPES = frozenset({"cuda", "rocm"})


def _check_range(kind: str, lo: object, hi: object) -> None:
    if not isinstance(lo, int) or not isinstance(hi, int) or isinstance(lo, bool | float):
        raise TypeError(f"{kind} capabilities must be integers, got {lo!r} and {hi!r}")
    if lo > hi:
        raise ValueError(f"min_capability ({lo}) must be <= max_capability ({hi})")


@dataclass(frozen=True)
class CUDAProperties:
    """A CUDA compute-capability interval, both ends included (75 = sm_75)."""

    min_capability: int
    max_capability: int

    def __post_init__(self) -> None:
        _check_range("CUDA", self.min_capability, self.max_capability)

    def validate_capability_range(self) -> None:
        """ValueError unless min_capability <= max_capability (checked at construction)."""
        _check_range("CUDA", self.min_capability, self.max_capability)

    def validate(self) -> None:
        """Check the fields again (`kernels`' strict dataclasses have it)."""
        self.__post_init__()


@dataclass(frozen=True)
class ROCMProperties:
    """A ROCm capability interval, both ends included (gfx942 = 94, as torch reports it)."""

    min_capability: int
    max_capability: int

    def __post_init__(self) -> None:
        _check_range("ROCm", self.min_capability, self.max_capability)

    def validate_capability_range(self) -> None:
        """ValueError unless min_capability <= max_capability (checked at construction)."""
        _check_range("ROCm", self.min_capability, self.max_capability)

    def validate(self) -> None:
        """Check the fields again (`kernels`' strict dataclasses have it)."""
        self.__post_init__()


@dataclass(frozen=True)
class Device:
    """A device type (`"cuda"`, `"cpu"`, ...) with optional capability properties."""

    type: str
    properties: CUDAProperties | ROCMProperties | None = None

    def __post_init__(self) -> None:
        if self.type not in SUPPORTED_DEVICE_TYPES:
            names = ", ".join(sorted(SUPPORTED_DEVICE_TYPES))
            raise ValueError(f"Unsupported device type {self.type!r}; supported: {names}")
        if isinstance(self.properties, CUDAProperties) and self.type != "cuda":
            raise ValueError("CUDAProperties is only supported for 'cuda' devices.")
        if isinstance(self.properties, ROCMProperties) and self.type != "rocm":
            raise ValueError("ROCMProperties is only supported for 'rocm' devices.")
        if self.properties is not None and not isinstance(
            self.properties, CUDAProperties | ROCMProperties
        ):
            raise TypeError(f"unknown device properties {self.properties!r}")

    def validate(self) -> None:
        """Check the fields again (`kernels`' strict dataclasses have it)."""
        self.__post_init__()

    def __str__(self) -> str:
        if self.properties is None:
            return self.type
        p = self.properties
        return f"{self.type}[{p.min_capability}..{p.max_capability}]"


def coerce_device(value: Any) -> Device:
    """A `Device` from a type name, ours, or a `kernels.Device` (same fields)."""
    if isinstance(value, Device):
        return value
    if isinstance(value, str):
        return Device(type=value)
    dtype = getattr(value, "type", None)
    if not isinstance(dtype, str):
        raise TypeError(f"expected a device type name or a Device, got {value!r}")
    props = getattr(value, "properties", None)
    converted: CUDAProperties | ROCMProperties | None = None
    if props is not None:
        lo, hi = props.min_capability, props.max_capability
        converted = CUDAProperties(lo, hi) if dtype == "cuda" else ROCMProperties(lo, hi)
    return Device(type=dtype, properties=converted)
