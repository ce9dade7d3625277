"""What `kernelize` did to each layer, and why: the answer to "is my model running kernels?".

A fallback keeps training going, so it must never be silent: every kernelizable layer instance
gets a `LayerReport` (status, machine-readable cause, human reason, and the repo, revision,
commit and variant involved), and `kernelize_report(model)` returns the last report of a model.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Cause", "KernelizeReport", "LayerReport", "LayerStatus", "LayerSummary"]


class LayerStatus(str, enum.Enum):
    """The outcome for one layer instance."""

    #: `forward` is the kernel layer's.
    KERNELIZED = "kernelized"
    #: A kernel was mapped but could not be used (failure or refusal): PyTorch forward kept.
    FALLBACK = "fallback"
    #: No mapping entry applies to this layer, device, capability or mode: PyTorch forward.
    UNMAPPED = "unmapped"
    #: Kept on PyTorch on purpose (DISABLE_KERNEL_MAPPING, KERNELD_DISABLE).
    DISABLED = "disabled"
    #: The layer's `condition` returned False for this instance.
    SKIPPED = "skipped"


class Cause(str, enum.Enum):
    """Why a layer is not kernelized (`NONE` when it is)."""

    NONE = ""
    NO_MAPPING = "no-mapping"
    NO_DEVICE = "no-device"
    NO_COMPATIBLE_PROPERTIES = "no-compatible-properties"
    NO_COMPATIBLE_MODE = "no-compatible-mode"
    MODE_UNSUPPORTED = "mode-unsupported"
    DAEMON_UNAVAILABLE = "daemon-unavailable"
    NOT_FOUND = "not-found"
    NO_COMPATIBLE_VARIANT = "no-compatible-variant"
    DENIED = "denied"
    UNAVAILABLE = "unavailable"
    UNTRUSTED_PATH = "untrusted-path"
    LOAD_ERROR = "load-error"
    LOCKFILE = "lockfile"
    INVALID_LAYER = "invalid-layer"
    SIGNATURE_MISMATCH = "signature-mismatch"
    NONDETERMINISTIC = "nondeterministic"
    DISABLE_KERNEL_MAPPING = "DISABLE_KERNEL_MAPPING"
    KERNELD_DISABLE = "KERNELD_DISABLE"
    CONDITION = "condition"
    ERROR = "error"


@dataclass(frozen=True)
class LayerReport:
    """One layer instance: `name` is its path in the model (`blocks.0.norm`)."""

    name: str
    layer_name: str
    module_class: str
    status: LayerStatus
    cause: Cause = Cause.NONE
    reason: str = ""
    repo: str = ""
    revision: str = ""
    commit: str = ""
    variant: str = ""
    hub_layer: str = ""
    repo_mode: str = ""
    provenance: str = ""
    """Who signed the kernel, as kerneld checked at ingest ("verified: signed by ...",
    "unsigned", "invalid"); empty: nothing recorded."""

    @property
    def kernelized(self) -> bool:
        return self.status is LayerStatus.KERNELIZED

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["cause"] = self.cause.value
        return data


@dataclass(frozen=True)
class LayerSummary:
    """All instances of one kernel layer name, for a per-layer-name overview."""

    layer_name: str
    instances: int
    kernelized: int
    statuses: dict[str, int]
    repos: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class KernelizeReport:
    """The result of one `kernelize` call, in model order."""

    mode: str
    device: str
    layers: tuple[LayerReport, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[LayerReport]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, name: str) -> LayerReport:
        for entry in self.layers:
            if entry.name == name:
                return entry
        raise KeyError(name)

    @property
    def kernelized(self) -> list[str]:
        """Names of the layer instances now running a kernel."""
        return [e.name for e in self.layers if e.kernelized]

    @property
    def not_kernelized(self) -> list[str]:
        return [e.name for e in self.layers if not e.kernelized]

    def by_status(self, status: LayerStatus | str) -> list[LayerReport]:
        wanted = LayerStatus(status)
        return [e for e in self.layers if e.status is wanted]

    def by_layer_name(self) -> dict[str, LayerSummary]:
        """One summary per kernel layer name (`RMSNorm`: 24 instances, 24 kernelized, ...)."""
        groups: dict[str, list[LayerReport]] = {}
        for entry in self.layers:
            groups.setdefault(entry.layer_name, []).append(entry)
        out: dict[str, LayerSummary] = {}
        for layer_name, entries in groups.items():
            statuses: dict[str, int] = {}
            for e in entries:
                statuses[e.status.value] = statuses.get(e.status.value, 0) + 1
            repos = tuple(
                dict.fromkeys(
                    f"{e.repo}@{e.commit or e.revision}" if e.revision else e.repo
                    for e in entries
                    if e.repo
                )
            )
            out[layer_name] = LayerSummary(
                layer_name=layer_name,
                instances=len(entries),
                kernelized=sum(e.kernelized for e in entries),
                statuses=statuses,
                repos=repos,
                reasons=tuple(dict.fromkeys(e.reason for e in entries if e.reason)),
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "device": self.device,
            "layers": [e.to_dict() for e in self.layers],
        }

    def format(self) -> str:
        """A plain-text table, one line per layer instance."""
        head = f"kernelize mode={self.mode} device={self.device}: "
        head += f"{len(self.kernelized)}/{len(self.layers)} layers kernelized"
        lines = [head]
        for e in self.layers:
            where = e.repo
            if e.revision:
                where += f"@{e.revision}"
            if e.commit and e.commit != e.revision:
                where += f" ({e.commit[:12]})"
            if e.variant:
                where += f" [{e.variant}]"
            if e.provenance:
                where += f" {{{e.provenance}}}"
            tail = f" {e.cause.value}: {e.reason}" if e.cause is not Cause.NONE else ""
            lines.append(f"  {e.name} <{e.layer_name}> {e.status.value} {where}{tail}".rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
