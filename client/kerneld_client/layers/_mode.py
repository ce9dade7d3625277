"""`Mode` flags, their fallback chains, and `KernelizeFallback`: the vocabulary of `kernelize`.

The names, values and chains are those of the `kernels` package, so mappings written for it mean
the same here. A `kernels.Mode` value is accepted wherever a `Mode` is (converted by member name),
so code that mixes the two packages keeps working.
"""

from __future__ import annotations

import enum

__all__ = ["MODE_FALLBACK_CHAINS", "KernelizeFallback", "Mode", "coerce_fallback", "coerce_mode"]


class Mode(enum.Flag):
    """What a kernel is used for: `INFERENCE` or `TRAINING`, optionally with `TORCH_COMPILE`.

    `FALLBACK` is only for mappings: the repo used when no other mode entry matches.
    """

    _NONE = 0
    FALLBACK = enum.auto()
    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    TORCH_COMPILE = enum.auto()

    def __or__(self, other: object) -> Mode:
        if not isinstance(other, Mode):
            return NotImplemented
        union = Mode(self.value | other.value)
        both = Mode.INFERENCE.value | Mode.TRAINING.value
        if union.value & both == both:
            raise ValueError("Mode.INFERENCE and Mode.TRAINING are mutually exclusive.")
        if union.value & Mode.FALLBACK.value and union is not Mode.FALLBACK:
            raise ValueError("Mode.FALLBACK cannot be combined with other modes.")
        return union


#: For each kernelize mode, the mapping entries to try, first match wins (as in `kernels`).
MODE_FALLBACK_CHAINS: dict[Mode, tuple[Mode, ...]] = {
    Mode.INFERENCE: (
        Mode.INFERENCE,
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING,
        Mode.TRAINING | Mode.TORCH_COMPILE,
        Mode.FALLBACK,
    ),
    Mode.TRAINING: (Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
    Mode.INFERENCE | Mode.TORCH_COMPILE: (
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING | Mode.TORCH_COMPILE,
        Mode.FALLBACK,
    ),
    Mode.TRAINING | Mode.TORCH_COMPILE: (Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
}


class KernelizeFallback(enum.Flag):
    """Which cases of `kernelize` keep the original forward instead of raising.

    `use_fallback=True` means `ALL` here (kerneld falls back on *any* failure, including a kernel
    that cannot be obtained, validated or imported); `False` means `NONE`. `DEFAULT` is what
    `kernels` calls its default: fall back for missing mapping entries, raise on load failures.
    """

    NONE = 0
    NO_LAYER = enum.auto()
    NO_DEVICE = enum.auto()
    NO_COMPATIBLE_PROPERTIES = enum.auto()
    NO_COMPATIBLE_MODE = enum.auto()
    CANNOT_LOAD = enum.auto()

    DEFAULT = NO_LAYER | NO_DEVICE | NO_COMPATIBLE_PROPERTIES | NO_COMPATIBLE_MODE
    ALL = DEFAULT | CANNOT_LOAD


def _flag_names(value: object) -> list[str]:
    """Member names set in a foreign Flag value (works on Python 3.10, where composite flags
    have no `name`)."""
    if not isinstance(value, enum.Flag):
        raise TypeError(f"expected a Mode flag, got {value!r}")
    names = []
    for name, member in type(value).__members__.items():
        if isinstance(member, enum.Flag) and member.value and (value & member) == member:
            names.append(name)
    return names


def coerce_mode(value: object) -> Mode:
    """A `Mode` from ours or from `kernels.Mode` (same member names)."""
    if isinstance(value, Mode):
        return value
    result = Mode._NONE
    for name in _flag_names(value):
        try:
            result = result | Mode[name]
        except KeyError:
            raise TypeError(f"unknown mode flag {name!r} in {value!r}") from None
    return result


def coerce_fallback(value: object) -> KernelizeFallback:
    """`use_fallback`: a bool (True = ALL), ours, or `kernels.KernelizeFallback`."""
    if isinstance(value, bool):
        return KernelizeFallback.ALL if value else KernelizeFallback.NONE
    if isinstance(value, KernelizeFallback):
        return value
    result = KernelizeFallback.NONE
    for name in _flag_names(value):
        if name in ("DEFAULT", "ALL"):
            continue
        try:
            result |= KernelizeFallback[name]
        except KeyError:
            raise TypeError(f"unknown fallback flag {name!r} in {value!r}") from None
    return result
