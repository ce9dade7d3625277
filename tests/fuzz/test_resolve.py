"""Resolve / ResolveMany request handling: the real Kernels servicer in-process over a real
store and mirror upstream (many examples), and a real daemon over gRPC (a few): every answer is
a kernel inside the store or a typed, explained error, never INTERNAL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kerneld.server.statuses import detail_from_trailers
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto.kerneld_pb2_grpc import KernelsStub
from tests.fixtures_daemon import ACT, C1, C2, DEP_TOP, MULTI, MULTI_VARIANTS
from tests.fuzz import harnesses
from tests.fuzz import invariants as inv
from tests.fuzz.strategies import HOSTILE_STRINGS, fuzz_settings
from tests.support.daemon import DaemonProcess

wire_text = st.sampled_from([s for s in HOSTILE_STRINGS if "\udc80" not in s]) | st.text(
    st.characters(exclude_categories=["Cs"]), max_size=20
)


VALID_PLATFORMS = [
    pb.PlatformFacts(torch_version="2.13", cxx11_abi=True, cpu="x86_64", os="linux"),
    pb.PlatformFacts(
        torch_version="2.13",
        cxx11_abi=True,
        cpu="x86_64",
        os="linux",
        backend=pb.Backend(type="cuda", version="12.8"),
        device_capabilities=["9.0"],
    ),
    pb.PlatformFacts(torch_version="2.12", cpu="aarch64", os="linux", python_version="3.11.7"),
    pb.PlatformFacts(cpu="x86_64", os="linux", free_threaded=True, python_version="3.13.1"),
]
#: Fields a mutation may set to something hostile (strings get `wire_text`).
STRING_FIELDS = [
    "kernel.repo_id",
    "kernel.revision",
    "kernel.locked_commit",
    "variant",
    "client",
    "platform.torch_version",
    "platform.cpu",
    "platform.os",
    "platform.python_version",
    "platform.macos_version",
    "platform.tvm_ffi_version",
    "platform.backend.type",
    "platform.backend.version",
]


def _set(message: pb.ResolveRequest, path: str, value: object) -> None:
    *parents, name = path.split(".")
    target = message
    for p in parents:
        target = getattr(target, p)
    setattr(target, name, value)


@st.composite
def resolve_requests(draw: st.DrawFn) -> pb.ResolveRequest:
    """A valid request (a real kernel, a selector, a platform), then 0-2 hostile mutations:
    most requests must get past the first check to reach resolution, fetch and the store."""
    request = pb.ResolveRequest(
        kernel=pb.KernelRef(
            repo_id=draw(st.sampled_from([ACT, MULTI, DEP_TOP, "kerneld-test/missing"]))
        ),
        allow_fetch=draw(st.sampled_from([True, True, False])),
        variant=draw(st.sampled_from(["", "", "", "torch-universal", *MULTI_VARIANTS[:3]])),
        client="fuzz",
        lease_seconds=draw(st.sampled_from([0, 60, 2**32 - 1])),
    )
    request.platform.CopyFrom(draw(st.sampled_from(VALID_PLATFORMS)))
    selector = draw(st.sampled_from(["version", "version", "revision", "locked_commit", "none"]))
    if selector == "version":
        request.kernel.version = draw(st.sampled_from([1, 1, 2, 0, 7]))
    elif selector == "revision":
        request.kernel.revision = draw(st.sampled_from(["main", "v1", "v2", "refs/heads/v1", C1]))
    elif selector == "locked_commit":
        request.kernel.locked_commit = draw(st.sampled_from([C1, C2]))
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["string", "string", "string", "number", "drop", "list"]))
        if op == "string":
            _set(request, draw(st.sampled_from(STRING_FIELDS)), draw(wire_text))
        elif op == "number":
            path = draw(st.sampled_from(["kernel.version", "lease_seconds"]))
            _set(
                request,
                path,
                draw(st.sampled_from([0, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1)),
            )
        elif op == "drop":
            request.ClearField(draw(st.sampled_from(["kernel", "platform"])))
        else:
            request.platform.device_capabilities.append(draw(wire_text))
            if draw(st.booleans()):
                request.platform.cxx11_abi = draw(st.booleans())
    return request


@pytest.fixture(scope="module")
def harness(
    kernel_mirror: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harnesses.ResolveHarness]:
    h = harnesses.ResolveHarness(tmp_path_factory.mktemp("fuzz-resolve"), kernel_mirror)
    yield h
    h.close()


CPU = pb.PlatformFacts(torch_version="2.13", cxx11_abi=True, cpu="x86_64", os="linux")


@fuzz_settings(150, deadline_s=10)
@given(resolve_requests())
@example(
    pb.ResolveRequest(kernel=pb.KernelRef(repo_id=ACT, version=1), platform=CPU, allow_fetch=True)
)
@example(
    pb.ResolveRequest(
        kernel=pb.KernelRef(repo_id=DEP_TOP, version=1), platform=CPU, allow_fetch=True
    )
)
@example(
    pb.ResolveRequest(
        kernel=pb.KernelRef(repo_id=ACT, version=1), platform=CPU, lease_seconds=2**32 - 1
    )
)
@example(
    pb.ResolveRequest(
        kernel=pb.KernelRef(repo_id=ACT),
        platform=pb.PlatformFacts(cpu="x86_64", os="linux", python_version=" "),
    )
)
def test_resolve_in_process(harness: harnesses.ResolveHarness, request: pb.ResolveRequest) -> None:
    harness.check_resolve(request)


@fuzz_settings(40, deadline_s=20)
@given(st.lists(resolve_requests(), max_size=4))
def test_resolve_many_in_process(
    harness: harnesses.ResolveHarness, requests: list[pb.ResolveRequest]
) -> None:
    harness.check_resolve_many(pb.ResolveManyRequest(requests=requests))


def test_harness_serves_kernels(harness: harnesses.ResolveHarness) -> None:
    """The success path is reachable (a fuzzer that only sees refusals would be blind)."""
    request = pb.ResolveRequest(
        kernel=pb.KernelRef(repo_id=ACT, version=1), platform=CPU, allow_fetch=True
    )
    response = harness.service.Resolve(request, harnesses.ServicerContext())  # type: ignore[arg-type]
    assert Path(response.kernel.path).is_dir()


# ---- over a real channel to a real daemon ----------------------------------------------------


@pytest.fixture(scope="module")
def daemon(
    kernel_mirror: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("fuzz-daemon"), mirror_dirs=[kernel_mirror]) as d:
        yield d


@fuzz_settings(15, deadline_s=20)
@given(resolve_requests(), st.binary(max_size=24))
def test_resolve_over_grpc(daemon: DaemonProcess, request: pb.ResolveRequest, junk: bytes) -> None:
    """The same requests as wire bytes (plus unknown trailing fields when they still parse)
    to the daemon's user socket, then in a ResolveMany; the daemon keeps serving afterwards."""
    wire = request.SerializeToString()
    try:
        pb.ResolveRequest.FromString(wire + junk)
        wire += junk
    except Exception:
        pass
    with daemon.channel() as channel:
        call = channel.unary_unary(
            "/kerneld.v1.Kernels/Resolve",
            request_serializer=lambda b: b,
            response_deserializer=pb.ResolveResponse.FromString,
        )
        try:
            response = call(wire, timeout=20)
        except grpc.RpcError as err:
            inv.expect(err.code() != grpc.StatusCode.UNKNOWN, f"UNKNOWN status: {err.details()}")
            detail = detail_from_trailers(err.trailing_metadata())
            inv.expect(detail is not None, f"{err.code()} without an ErrorDetail: {err.details()}")
            harnesses.check_error_detail(detail, "Resolve over gRPC")
        else:
            inv.expect(Path(response.kernel.path).is_dir(), "served a path that does not exist")
        stub = KernelsStub(channel)
        many = stub.ResolveMany(pb.ResolveManyRequest(requests=[request, request]), timeout=20)
        inv.expect(len(many.results) == 2, "ResolveMany lost results")
        for result in many.results:
            if result.WhichOneof("result") == "error":
                harnesses.check_error_detail(result.error, "ResolveMany over gRPC")
        inv.expect(stub.GetStatus(pb.GetStatusRequest(), timeout=20).ready, "the daemon stopped")
