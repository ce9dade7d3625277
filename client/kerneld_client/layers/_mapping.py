"""Kernel mappings: layer name -> device -> repo, or -> {Mode: repo}.

Semantics follow `kernels`: a mapping value that is a repo means `{Mode.FALLBACK: repo}`;
registering an entry for a device type (or, for CUDA/ROCm, for a capability interval) replaces
the previous entry for that same key; `inherit_mapping=False` starts from an empty mapping.

`register_kernel_mapping` changes the process-wide mapping, except inside `use_kernel_mapping`,
whose changes (its own mapping, and any registration made inside it) are visible only in that
context (a `ContextVar`, so threads and asyncio tasks that did not enter it are unaffected) and
are undone on exit. Registering the same interval twice replaces the older entry instead of
keeping both (so which of the two wins never depends on object addresses).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from kerneld_client.layers._device import CAPABILITY_DEVICE_TYPES, Device, coerce_device
from kerneld_client.layers._mode import MODE_FALLBACK_CHAINS, Mode, coerce_mode

__all__ = [
    "MappingMiss",
    "Selection",
    "register_kernel_mapping",
    "select_repository",
    "use_kernel_mapping",
]

#: Mode keys a mapping may use.
_MAPPING_MODES = frozenset({Mode.FALLBACK, *MODE_FALLBACK_CHAINS})


@dataclass(frozen=True)
class _Entry:
    """Repos for one device type and capability interval (unconstrained: the whole range)."""

    lo: int
    hi: int
    constrained: bool
    repos: Mapping[Mode, Any]
    seq: int


_LayerMap = dict[str, dict[str, list[_Entry]]]

_GLOBAL: _LayerMap = {}
_global_lock = threading.Lock()
_CONTEXT: ContextVar[_LayerMap | None] = ContextVar("kerneld_kernel_mapping", default=None)
_seq = itertools.count()


def _active() -> _LayerMap:
    scoped = _CONTEXT.get()
    return _GLOBAL if scoped is None else scoped


def _copy(mapping: _LayerMap) -> _LayerMap:
    return {
        layer: {dev: list(entries) for dev, entries in devs.items()}
        for layer, devs in mapping.items()
    }


def _check_repo(repo: Any, where: str) -> None:
    if not callable(getattr(repo, "load", None)):
        raise TypeError(
            f"{where}: {repo!r} is not a layer repository (LayerRepository, "
            "LockedLayerRepository, LocalLayerRepository or an object with a load() method)"
        )


def _merge(target: _LayerMap, mapping: Mapping[str, Mapping[Any, Any]]) -> None:
    for layer_name, device_repos in mapping.items():
        if not isinstance(layer_name, str):
            raise TypeError(f"layer names must be strings, got {layer_name!r}")
        for device_key, value in device_repos.items():
            device = coerce_device(device_key)
            where = f"mapping for `{layer_name}` on {device}"
            if isinstance(value, Mapping):
                repos: dict[Mode, Any] = {}
                for mode_key, repo in value.items():
                    mode = coerce_mode(mode_key)
                    if mode not in _MAPPING_MODES:
                        raise ValueError(f"{where}: unsupported mode {mode}")
                    _check_repo(repo, where)
                    repos[mode] = repo
            else:
                _check_repo(value, where)
                repos = {Mode.FALLBACK: value}
            props = device.properties
            if props is None:
                lo, hi, constrained = 0, sys.maxsize, False
            else:
                lo, hi, constrained = props.min_capability, props.max_capability, True
            entries = target.setdefault(layer_name, {}).setdefault(device.type, [])
            entries[:] = [
                e for e in entries if (e.lo, e.hi, e.constrained) != (lo, hi, constrained)
            ]
            entries.append(_Entry(lo, hi, constrained, repos, next(_seq)))


def register_kernel_mapping(
    mapping: Mapping[str, Mapping[Any, Any]], inherit_mapping: bool = True
) -> None:
    """Add `mapping` to the active mapping (replace it when `inherit_mapping` is False)."""
    scoped = _CONTEXT.get()
    if scoped is not None:
        staged = {} if not inherit_mapping else _copy(scoped)
        _merge(staged, mapping)
        scoped.clear()
        scoped.update(staged)
        return
    with _global_lock:
        staged = {} if not inherit_mapping else _copy(_GLOBAL)
        _merge(staged, mapping)  # a bad mapping raises before anything changes
        _GLOBAL.clear()
        _GLOBAL.update(staged)


@contextlib.contextmanager
def use_kernel_mapping(
    mapping: Mapping[str, Mapping[Any, Any]], *, inherit_mapping: bool = True
) -> Iterator[None]:
    """Use `mapping` (on top of the active one unless `inherit_mapping=False`) inside the block."""
    base = _copy(_active()) if inherit_mapping else {}
    _merge(base, mapping)
    token = _CONTEXT.set(base)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class MappingMiss(Exception):
    """No mapping entry applies; `stage` says at which level (no-mapping, no-device, ...)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


@dataclass(frozen=True)
class Selection:
    """The repo chosen for a layer, and the mode entry and device entry it came from."""

    repo: Any
    repo_mode: Mode
    device: str


def _current_capability(device_type: str) -> tuple[int | None, str]:
    """The current device's capability from the platform facts, and where it came from."""
    from kerneld_client.layers._device import capability_number
    from kerneld_client.platform import platform_facts

    facts = platform_facts()
    for cap in facts.device_capabilities:
        number = capability_number(cap)
        if number is not None:
            return number, cap
    return None, f"no {device_type} device capability is known"


def select_repository(layer_name: str, device: Device, mode: Mode) -> Selection:
    """The repo the active mapping gives `layer_name` on `device` in `mode`, or MappingMiss."""
    devices = _active().get(layer_name)
    if devices is None:
        raise MappingMiss(
            "no-mapping", f"No layer mapping for `{layer_name}` (no kernel is mapped to it)"
        )
    entries = list(devices.get(device.type) or ())
    if not entries:
        known = ", ".join(sorted(devices)) or "none"
        raise MappingMiss(
            "no-device",
            f"No layer mapping for `{layer_name}` with device type `{device.type}` "
            f"(the mapping has: {known})",
        )
    candidates = [e for e in entries if not e.constrained]
    where = device.type
    if device.type in CAPABILITY_DEVICE_TYPES and any(e.constrained for e in entries):
        capability, source = _current_capability(device.type)
        if capability is not None:
            candidates = [e for e in entries if e.lo <= capability <= e.hi]
            where = f"{device.type} capability {capability}"
        if not candidates:
            ranges = ", ".join(f"{e.lo}..{e.hi}" for e in entries if e.constrained)
            detail = f"capability {capability}" if capability is not None else source
            raise MappingMiss(
                "no-compatible-properties",
                f"No layer mapping for `{layer_name}` device `{device.type}` with the right "
                f"properties (none covers {detail}; intervals: {ranges})",
            )
    best = min(candidates, key=lambda e: (e.hi - e.lo, -e.seq))
    chain = MODE_FALLBACK_CHAINS.get(mode)
    if chain is None:
        raise ValueError(f"Unsupported kernelize mode: {mode}")
    for candidate in chain:
        repo = best.repos.get(candidate)
        if repo is not None:
            return Selection(repo=repo, repo_mode=candidate, device=where)
    have = ", ".join(str(m) for m in best.repos) or "none"
    raise MappingMiss(
        "no-compatible-mode",
        f"No repository for `{layer_name}` for configuration mode={mode} (on {where} the "
        f"mapping has: {have})",
    )
