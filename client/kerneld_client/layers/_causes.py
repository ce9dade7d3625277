"""What the report calls each way a mapped layer ends up on PyTorch.

Two sources: an exception raised while obtaining or checking the kernel layer (the daemon's
typed errors, a lock file, an import, an invalid layer), which `classify` turns into a `Cause`
and a human reason, and a mapping miss, which `MISS_CAUSES` turns into a `Cause` and the
`KernelizeFallback` flag that must allow it. The `kerneld_client` error types are imported only
when a failure is classified.
"""

from __future__ import annotations

from dataclasses import dataclass

from kerneld_client.layers._layer_checks import InvalidKernelLayer
from kerneld_client.layers._mode import KernelizeFallback
from kerneld_client.layers._report import Cause

__all__ = ["MISS_CAUSES", "Failure", "classify", "is_configuration_error"]

_DENIED_REASON = "denied by the host administrator"


@dataclass(frozen=True)
class Failure:
    """Why a kernel layer could not be obtained: the report's cause and reason, and the error
    `kernelize` raises when the fallback policy does not allow keeping PyTorch."""

    cause: Cause
    reason: str
    error: BaseException


def classify(exc: BaseException) -> tuple[Cause, str]:
    """The report cause and reason of an exception raised while obtaining a kernel layer."""
    from kerneld_client import errors
    from kerneld_client.lockfile import LockfileError

    text = str(exc) or type(exc).__name__
    if isinstance(exc, errors.KernelDenied):
        detail = exc.message if exc.message else ""
        return Cause.DENIED, f"{_DENIED_REASON} ({detail})" if detail else _DENIED_REASON
    table: tuple[tuple[type[BaseException], Cause], ...] = (
        (errors.DaemonUnavailable, Cause.DAEMON_UNAVAILABLE),
        (errors.NoCompatibleVariant, Cause.NO_COMPATIBLE_VARIANT),
        (errors.KernelNotFound, Cause.NOT_FOUND),
        (errors.KernelUnavailable, Cause.UNAVAILABLE),
        (errors.UntrustedPath, Cause.UNTRUSTED_PATH),
        (errors.KernelLoadError, Cause.LOAD_ERROR),
        (LockfileError, Cause.LOCKFILE),
        (ImportError, Cause.LOAD_ERROR),
        (FileNotFoundError, Cause.NOT_FOUND),
        (ConnectionError, Cause.DAEMON_UNAVAILABLE),
    )
    if isinstance(exc, InvalidKernelLayer):
        return (Cause.SIGNATURE_MISMATCH if exc.signature else Cause.INVALID_LAYER), text
    for kind, cause in table:
        if isinstance(exc, kind):
            return cause, text
    return Cause.ERROR, f"{type(exc).__name__}: {text}"


def is_configuration_error(exc: BaseException) -> bool:
    """An error no fallback can make right: `kernelize` raises it whatever `use_fallback`
    says, as `kernels` does. A version or revision the repo does not have (the mapping can
    never be right), and a repo whose publisher is untrusted (a security decision, not an
    outage; a publisher that could not be checked is an outage, KernelUnavailable)."""
    from kerneld_client.errors import RevisionNotFound, UntrustedPublisher

    return isinstance(exc, RevisionNotFound | UntrustedPublisher)


#: `MappingMiss.stage` -> the report's cause, and the fallback flag that allows it.
MISS_CAUSES = {
    "no-mapping": (Cause.NO_MAPPING, KernelizeFallback.NO_LAYER),
    "no-device": (Cause.NO_DEVICE, KernelizeFallback.NO_DEVICE),
    "no-compatible-properties": (
        Cause.NO_COMPATIBLE_PROPERTIES,
        KernelizeFallback.NO_COMPATIBLE_PROPERTIES,
    ),
    "no-compatible-mode": (Cause.NO_COMPATIBLE_MODE, KernelizeFallback.NO_COMPATIBLE_MODE),
}
