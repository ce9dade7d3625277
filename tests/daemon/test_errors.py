"""The error table: every typed error -> gRPC status + ErrorDetail code, with its context."""

from __future__ import annotations

import grpc
import pytest

from kerneld.config import ConfigError
from kerneld.pipeline.resolve import DependencyCycle, FetchNotAllowed, NoVariantFits
from kerneld.server.statuses import NotReady, Unimplemented, classify
from kerneld.store import (
    DeniedError,
    DigestMismatchError,
    InvalidPathError,
    LeaseNotFoundError,
    MetadataError,
    ResourceExhaustedError,
    TreeNotFoundError,
)
from kerneld.upstream.errors import (
    EntryNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamProtocolError,
    UpstreamUnavailable,
)
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.variants import PlatformFacts, decide

S = grpc.StatusCode
E = pb.ErrorCode
CPU = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)

CASES = [
    (DeniedError("bad", repo_id="o/n", commit="c" * 40), S.PERMISSION_DENIED, E.KERNEL_DENIED),
    (FetchNotAllowed("no", repo_id="o/n", revision="v1"), S.PERMISSION_DENIED, E.FETCH_NOT_ALLOWED),
    (
        NoVariantFits(decide(["torch-cuda"], CPU), repo_id="o/n", revision="c" * 40),
        S.FAILED_PRECONDITION,
        E.NO_COMPATIBLE_VARIANT,
    ),
    (DependencyCycle("a -> b -> a", repo_id="o/n"), S.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
    (RepoNotFound("x", repo_id="o/n"), S.NOT_FOUND, E.KERNEL_NOT_FOUND),
    (RevisionNotFound("x", repo_id="o/n", revision="v9"), S.NOT_FOUND, E.REVISION_NOT_FOUND),
    (EntryNotFound("x", repo_id="o/n"), S.NOT_FOUND, E.KERNEL_NOT_FOUND),
    (TreeNotFoundError("gone"), S.NOT_FOUND, E.KERNEL_NOT_FOUND),
    (LeaseNotFoundError("expired"), S.NOT_FOUND, E.INVALID_ARGUMENT),
    (UpstreamUnavailable("down", upstream="hub"), S.UNAVAILABLE, E.UPSTREAM_UNAVAILABLE),
    (UpstreamProtocolError("junk"), S.UNAVAILABLE, E.UPSTREAM_UNAVAILABLE),
    (DigestMismatchError("sha256", "a", "b", repo_id="o/n"), S.DATA_LOSS, E.INTEGRITY_ERROR),
    (MetadataError("no metadata.json"), S.DATA_LOSS, E.INTEGRITY_ERROR),
    (ResourceExhaustedError(10, 1, "size cap"), S.RESOURCE_EXHAUSTED, E.RESOURCE_EXHAUSTED),
    (InvalidPathError("../x", "dot-dot"), S.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
    (ValueError("bad repo id"), S.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
    (ConfigError("f.toml", "log.level", "bad"), S.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
    (NotReady("starting"), S.UNAVAILABLE, E.NOT_READY),
    (Unimplemented("no mirror module"), S.UNIMPLEMENTED, E.INTERNAL),
    (RuntimeError("boom"), S.INTERNAL, E.INTERNAL),
]


@pytest.mark.parametrize(("exc", "status", "code"), CASES, ids=lambda v: type(v).__name__)
def test_error_table(exc: BaseException, status: grpc.StatusCode, code: int) -> None:
    failure = classify(exc, repo_id="fallback/repo")
    assert failure.status == status
    assert failure.detail.code == code
    assert failure.detail.message
    assert failure.detail.repo_id in ("o/n", "fallback/repo")


def test_context_and_variants_travel_in_the_detail() -> None:
    decisions = decide(["torch-cuda", "torch213-cxx11-cu128-x86_64-linux"], CPU)
    detail = classify(NoVariantFits(decisions, repo_id="o/n", revision="c" * 40)).detail
    assert (detail.repo_id, detail.revision) == ("o/n", "c" * 40)
    assert [(v.variant, v.accepted) for v in detail.variants] == [
        (d.variant, False) for d in decisions
    ]
    assert all(v.reason for v in detail.variants)
    denied = classify(DeniedError("broken", repo_id="o/n", commit="c" * 40, variant="torch-cpu"))
    assert (denied.detail.revision, denied.detail.variant) == ("c" * 40, "torch-cpu")
    assert "kerneldctl allow o/n" in denied.detail.hint
    internal = classify(RuntimeError("boom")).detail
    assert internal.message == "internal error: RuntimeError: boom"
