"""Every kerneld error class, pinned to the answer it gets: the gRPC status, the ErrorDetail code
and the Hub endpoint's HTTP status (issue 54). The pins were taken from the per-class tables
before errors carried a kind; a class added later must be pinned here (the walk finds it), so a
change of any outward status is a visible edit of this table, never a side effect."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from kerneld.server.fronts.hubapi.server import _hub_error
from kerneld.server.statuses import classify
from kerneld_client.proto import kerneld_pb2 as pb
from tests.support.errors import kerneld_error_classes, sample

#: class name -> (gRPC status, ErrorDetail code, the Hub endpoint's HTTP status). Taken from
#: the per-class tables before kinds; the rows marked changed since, on purpose:
#: [1] never answered a call (kerneldctl's own, the HTTP front's parse errors, the Hub
#:     endpoint's answers, exceptions caught in the module that raises them): each now has the
#:     kind it means, where before an escape would have read "internal error";
#: [2] the HTTP status disagreed with the gRPC one, and now follows the kind: a lease not found
#:     is a 404 (was 400), a bad caller token a 401 (was 400), an RPC this build lacks a 501
#:     (was 500), no variant fitting a 404 (was 500: a daemon fault, logged as one). Only the
#:     last can reach the Hub endpoint (a variant gone from the listing between two calls).
PINNED: dict[str, tuple[str, str, int]] = {
    "ConfigError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "CtlError": ("INTERNAL", "INTERNAL", 500),
    "DaemonNotReachable": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),  # [1]
    "PermissionDenied": ("PERMISSION_DENIED", "KERNEL_DENIED", 403),  # [1]
    "BundleError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "ExportError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "MirrorFormatError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "MirrorImportRefused": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "KeyFileError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "SignatureError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "_Missing": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),  # [1]
    "Cancelled": ("INTERNAL", "INTERNAL", 500),
    "DependencyCycle": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "FetchNotAllowed": ("PERMISSION_DENIED", "FETCH_NOT_ALLOWED", 403),
    "NoVariantFits": ("FAILED_PRECONDITION", "NO_COMPATIBLE_VARIANT", 404),  # [2]
    "ResolveError": ("INTERNAL", "INTERNAL", 500),
    "_VersionMissing": ("NOT_FOUND", "REVISION_NOT_FOUND", 404),  # [1]
    "PublishError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "ActivationError": ("INTERNAL", "INTERNAL", 500),
    "_StreamClosed": ("INTERNAL", "INTERNAL", 500),
    "RequestTooLarge": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "HeadError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),  # [1]
    "HubError": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),  # [1]
    "NotAKernelRepo": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),
    "UploadRefused": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "NoHubUpstream": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "PublisherUnknown": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "PublisherUnverified": (
        "UNAVAILABLE",
        "UPSTREAM_UNAVAILABLE",
        503,
    ),
    "UntrustedPublisher": (
        "PERMISSION_DENIED",
        "UNTRUSTED_PUBLISHER",
        403,
    ),
    "SocketBusy": ("INTERNAL", "INTERNAL", 500),
    "SocketSetupError": ("INTERNAL", "INTERNAL", 500),
    "NotReady": ("UNAVAILABLE", "NOT_READY", 503),
    "RateLimited": ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", 429),
    "ReportsRateLimited": ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", 429),
    "Unauthenticated": ("UNAUTHENTICATED", "INVALID_ARGUMENT", 401),  # [2]
    "Unimplemented": ("UNIMPLEMENTED", "INTERNAL", 501),  # [2]
    "BlobMissingError": ("DATA_LOSS", "INTEGRITY_ERROR", 502),
    "DeniedError": ("PERMISSION_DENIED", "KERNEL_DENIED", 403),
    "DigestMismatchError": ("DATA_LOSS", "INTEGRITY_ERROR", 502),
    "DuplicatePathError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "IngestInProgressError": ("INTERNAL", "INTERNAL", 500),
    "IntegrityError": ("DATA_LOSS", "INTEGRITY_ERROR", 502),
    "InvalidDigestError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "InvalidInputError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "InvalidPathError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "InvalidRepoError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "InvalidRevisionError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "LeaseNotFoundError": ("NOT_FOUND", "INVALID_ARGUMENT", 404),  # [2]
    "MetadataDigestError": ("DATA_LOSS", "INTEGRITY_ERROR", 502),
    "MetadataError": ("DATA_LOSS", "INTEGRITY_ERROR", 502),
    "PathConflictError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "ProvenanceError": ("PERMISSION_DENIED", "KERNEL_DENIED", 403),
    "ReadOnlyStoreError": ("INTERNAL", "INTERNAL", 500),
    "ResourceExhaustedError": (
        "RESOURCE_EXHAUSTED",
        "RESOURCE_EXHAUSTED",
        507,
    ),
    "SchemaError": ("INTERNAL", "INTERNAL", 500),
    "SizeMismatchError": ("DATA_LOSS", "INTEGRITY_ERROR", 502),
    "StoreError": ("INTERNAL", "INTERNAL", 500),
    "StoreLockedError": ("INTERNAL", "INTERNAL", 500),
    "StoreOwnershipError": ("INTERNAL", "INTERNAL", 500),
    "TreeNotFoundError": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),
    "UnresolvedDenyError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "UnsupportedFileTypeError": ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400),
    "Denied": ("PERMISSION_DENIED", "KERNEL_DENIED", 403),  # [1]
    "ScrubCancelled": ("INTERNAL", "INTERNAL", 500),
    "EntryNotFound": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),
    "MalformedAnswer": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "OrgNotFound": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),
    "RepoNotFound": ("NOT_FOUND", "KERNEL_NOT_FOUND", 404),
    "RevisionNotFound": ("NOT_FOUND", "REVISION_NOT_FOUND", 404),
    "UpstreamError": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "UpstreamPending": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "UpstreamProtocolError": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "UpstreamUnavailable": ("UNAVAILABLE", "UPSTREAM_UNAVAILABLE", 503),
    "TransientError": ("INTERNAL", "INTERNAL", 500),
}


#: What no kerneld class says, but the daemon still answers for: a builtin ValueError (a repo
#: id the client library refused), the store's file system failing under it, anything else.
BUILTINS: list[tuple[BaseException, tuple[str, str, int]]] = [
    (ValueError("bad repo id"), ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400)),
    (
        OSError(errno.ENOSPC, "No space left on device"),
        ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", 507),
    ),
    (
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", 507),
    ),
    (
        sqlite3.OperationalError("database or disk is full"),
        ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", 507),
    ),
    (OSError(errno.EROFS, "Read-only file system"), ("INTERNAL", "INTERNAL", 500)),
    (OSError(errno.EIO, "Input/output error"), ("INTERNAL", "INTERNAL", 500)),
    (OSError(errno.ENOENT, "No such file"), ("INTERNAL", "INTERNAL", 500)),
    (KeyError("x"), ("INTERNAL", "INTERNAL", 500)),
    (RuntimeError("boom"), ("INTERNAL", "INTERNAL", 500)),
]


def answers(exc: BaseException) -> tuple[str, str, int]:
    """(gRPC status, ErrorDetail code, the Hub endpoint's HTTP status) for `exc`."""
    failure = classify(exc)
    http = _hub_error(exc, ["api", "kernels", "o", "n"])
    return failure.status.name, pb.ErrorCode.Name(failure.detail.code), http.status


def test_every_error_class_is_pinned() -> None:
    classes = kerneld_error_classes()
    assert len(classes) > 60  # the walk sees the modules
    assert sorted(classes) == sorted(PINNED), "pin the new class's statuses here"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_status_is_pinned(name: str) -> None:
    assert answers(sample(kerneld_error_classes()[name])) == PINNED[name]


@pytest.mark.parametrize(("exc", "pinned"), BUILTINS, ids=lambda v: type(v).__name__)
def test_builtin_status_is_pinned(exc: BaseException, pinned: tuple[str, str, int]) -> None:
    assert answers(exc) == pinned
