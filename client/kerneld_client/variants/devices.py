"""Whether a build's declared device architectures (`metadata.json` `backend.archs`) cover
this process's devices: checked before import, so a kernel built for another GPU never loads.
Standard library only: a warm load of a GPU build runs this check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kerneld_client.device_names import parse_cuda_capability

_CUDA_ARCH_RE = re.compile(r"([0-9]+)\.([0-9]+)([af]?)(\+PTX)?")


def _cuda_arch_supports(arch: str, cap: tuple[int, int]) -> bool | None:
    m = _CUDA_ARCH_RE.fullmatch(arch)
    if m is None:
        return None
    try:
        arch_cap = (int(m.group(1)), int(m.group(2)))
    except ValueError:  # more digits than int() converts: not an arch anyone builds for
        return None
    suffix, ptx = m.group(3), m.group(4) is not None
    if suffix == "a":  # architecture-specific: that capability only
        return cap == arch_cap
    if suffix == "f" or not ptx:  # family / plain: same major, same or newer minor
        return cap[0] == arch_cap[0] and cap[1] >= arch_cap[1]
    return cap >= arch_cap  # +PTX: JIT-compiled on any newer device


def arch_compatible(archs: Sequence[str], capability: str) -> tuple[bool, str]:
    """Can a build declaring `archs` run on a device of `capability` (`9.0`, `gfx942`)?

    Loading a kernel without an image for the device can kill the process, so this is checked
    before import. As in `kernels`: no archs, or only archs in an unknown format, means "cannot
    tell", which is allowed; ROCm gfx targets must match exactly (feature flags stripped).
    """
    listed = ", ".join(archs)
    if not archs:
        return True, "the build declares no architectures"
    if capability.startswith("gfx"):
        target = capability.split(":", maxsplit=1)[0]
        if target in archs:
            return True, f"ROCm arch {target} is declared by the build"
        return False, f"ROCm arch {target} is not among the build's architectures: {listed}"
    cap = parse_cuda_capability(capability)
    if cap is None:
        return True, f"device capability {capability[:40]!r} is not understood; not checked"
    verdicts = [_cuda_arch_supports(a, cap) for a in archs]
    if all(v is None for v in verdicts):
        return True, f"the build's architectures are in an unknown format: {listed}"
    for arch, ok in zip(archs, verdicts, strict=True):
        if ok:
            return True, f"CUDA capability {capability} is supported by {arch}"
    return False, f"CUDA capability {capability} is not supported by the build's archs: {listed}"


def device_compatible(
    backend_type: str, archs: Sequence[str], local_backend: str, capabilities: Sequence[str]
) -> tuple[bool, str]:
    """`arch_compatible` for every device of a process (its backend type and its devices'
    `capabilities`, as in `PlatformFacts`), applied only where `kernels` checks: a CUDA build
    on a CUDA process or a ROCm build on a ROCm process, with known devices. Plain values, so
    a warm load checks its devices without importing the variant rules."""
    btype = backend_type.lower()
    if btype not in ("cuda", "rocm") or btype != local_backend or not capabilities:
        return True, "no device architecture check applies"
    for cap in capabilities:
        ok, why = arch_compatible(archs, cap)
        if not ok:
            return False, why
    return True, "every device is supported by the build's architectures"
