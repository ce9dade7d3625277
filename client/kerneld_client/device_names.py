"""The machine and device names the client and the daemon must spell alike, each defined once:
the machine (`x86_64`, `aarch64`), a CUDA capability (`9.0`), a ROCm target (`gfx942`).

The daemon detecting a GPU as `9.0` while the client reads `sm_90` would be a bug that no test
of one side finds (docs/architecture.md, "One definition"). Apart from `vocabulary` because the
warm path does not use these: it imports `vocabulary` on every fresh process. Standard library
only.
"""

from __future__ import annotations

_HEX = "0123456789abcdef"


def normalise_machine(machine: str, os_name: str) -> str:
    """`platform.machine()` as variant names spell it, as `kernels` does: macOS `arm64` and
    Windows `AMD64` are renamed, nothing else is (Linux already says `aarch64`/`x86_64`)."""
    if os_name == "darwin" and machine == "arm64":
        return "aarch64"
    if os_name == "windows" and machine == "AMD64":
        return "x86_64"
    return machine


def cuda_capability(major: int, minor: int) -> str:
    """A CUDA compute capability as kerneld spells it everywhere: `9.0` (not `sm_90`, not 90)."""
    return f"{major}.{minor}"


def rocm_target(major: int, minor: int, stepping: int) -> str:
    """A ROCm gfx target from its numbers: (9, 4, 2) -> `gfx942`, (9, 0, 10) -> `gfx90a`."""
    return f"gfx{major}{minor:x}{stepping:x}"


def parse_cuda_capability(text: str) -> tuple[int, int] | None:
    """`9.0` -> (9, 0); None when `text` is not a CUDA capability."""
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isascii() and minor.isascii() and major.isdigit() and minor.isdigit()):
        return None
    try:
        return int(major), int(minor)
    except ValueError:  # more digits than int() converts: not a capability anyone has
        return None


def parse_rocm_target(text: str) -> tuple[int, int, int] | None:
    """`gfx942` / `gfx90a:sramecc+:xnack-` -> (9, 4, 2) / (9, 0, 10); None otherwise."""
    target = text.strip().lower().split(":", maxsplit=1)[0]
    digits = target[3:]
    if not target.startswith("gfx") or len(digits) < 3 or not digits.isascii():
        return None
    major, minor, stepping = digits[:-2], digits[-2], digits[-1]
    if not major.isdigit() or minor not in _HEX or stepping not in _HEX:
        return None
    return int(major), int(minor, 16), int(stepping, 16)


def capability_number(text: str) -> int | None:
    """`"8.6"` -> 86; a ROCm target `"gfx942"` -> 94 (major 9, minor 4, as torch's
    `get_device_capability` reports it on ROCm); None when not understood. The numbers a layer
    mapping's `CUDAProperties`/`ROCMProperties` intervals hold."""
    cuda = parse_cuda_capability(text)
    if cuda is not None:
        return cuda[0] * 10 + cuda[1]
    rocm = parse_rocm_target(text)
    if rocm is not None:
        return rocm[0] * 10 + rocm[1]
    return None
