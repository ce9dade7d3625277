"""What kind of failure an error is: the one fact every outward answer is made from.

Each kerneld error class says its kind in a class attribute, `kind`, inherited from its base
where the base already says it; a subclass of the builtin `ValueError` (ConfigError, PublishError,
the mirror's format errors) is INVALID, the builtin's own meaning, unless it says otherwise. A
family base that is never raised itself (`StoreError`,
`ResolveError`) says `INTERNAL`, and each member that means something else says so;
tests/test_error_kinds.py checks that every class has exactly one kind and that none contradicts
its base's without a listed reason. The daemon turns a kind into a gRPC status and an HTTP status
with one table (`kerneld/server/statuses.py`), which the gRPC services and the Hub endpoint both
answer from, so a cause reads the same on every front.

A class may also name the finer `ErrorDetail` code the client branches on (`wire_code`) where
its kind's own does not say enough: a revision, not a repository, is missing; a fetch, not the
kernel, is refused. Callers still branch on classes; the kind is for mapping, logs and tests.

This module imports nothing of kerneld: the store, the pipeline, the upstreams and kerneldctl
all declare kinds, so it sits below them all.
"""

from __future__ import annotations

import enum
from typing import Literal


class ErrorKind(enum.Enum):
    """The kinds of failure, each one way to answer a caller."""

    #: What was asked for does not exist (there, at that revision, or any more).
    NOT_FOUND = "not found"
    #: It exists, and this host's policy refuses it (a deny, publisher trust, no fetching).
    DENIED = "denied"
    #: Who is asking could not be established (a forged or expired caller token).
    UNAUTHENTICATED = "unauthenticated"
    #: The request or its input is malformed: asked again the same way, it fails again.
    INVALID = "invalid"
    #: It exists, but nothing of it fits this platform (no build variant does).
    UNSUITABLE = "unsuitable"
    #: It cannot be had now, and may be later: an upstream outage, a daemon still starting.
    UNAVAILABLE = "unavailable"
    #: Bytes do not match what was promised (a digest, a size, metadata.json).
    CORRUPT = "corrupt"
    #: A capacity ran out: the store's size cap, its file system.
    EXHAUSTED = "exhausted"
    #: This caller asked too often; the same request later will do.
    RATE_LIMITED = "rate limited"
    #: This build cannot do it (a module it was built without).
    UNIMPLEMENTED = "unimplemented"
    #: A fault of the daemon; also a family base's kind, which its members refine.
    INTERNAL = "internal"


#: The `ErrorDetail` codes (kerneld.proto's `ErrorCode`) a class may name, by their names, so
#: the lowest layer needs no protobuf.
WireCode = Literal[
    "KERNEL_NOT_FOUND",
    "REVISION_NOT_FOUND",
    "NO_COMPATIBLE_VARIANT",
    "KERNEL_DENIED",
    "FETCH_NOT_ALLOWED",
    "UPSTREAM_UNAVAILABLE",
    "INTEGRITY_ERROR",
    "RESOURCE_EXHAUSTED",
    "INVALID_ARGUMENT",
    "NOT_READY",
    "INTERNAL",
    "UNTRUSTED_PUBLISHER",
]


def kind_of(exc: BaseException) -> ErrorKind:
    """`exc`'s kind: the one it (or its class) declares; a builtin `ValueError` is input that
    was refused (INVALID); anything else that declares none is a fault of the daemon."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, ErrorKind):
        return kind
    if isinstance(exc, ValueError):
        return ErrorKind.INVALID
    return ErrorKind.INTERNAL


def wire_code_of(exc: BaseException) -> WireCode | None:
    """The `ErrorDetail` code `exc`'s class names, if it names one (else its kind's)."""
    code: WireCode | None = getattr(exc, "wire_code", None)
    return code
