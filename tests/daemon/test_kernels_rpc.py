"""The Kernels service of a real daemon over its user socket (mirror upstream, no Hub)."""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kerneld_client.locations import read_advert
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto.kerneld_pb2_grpc import KernelsStub
from tests.daemon.rpc import (
    CPU,
    CUDA129,
    TIMEOUT,
    connect_as,
    facts,
    failure,
    ref,
    resolve_req,
    tree_files,
)
from tests.fixtures_daemon import ACT, C1, C2, DEP_BOTTOM, DEP_TOP, MULTI, mirror_kernels
from tests.support.daemon import ADMIN_SERVICE, KERNELS_SERVICE, DaemonProcess

E = pb.ErrorCode


@pytest.fixture(scope="module")
def daemon(
    kernel_mirror: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    workdir = tmp_path_factory.mktemp("kernels-rpc")
    with DaemonProcess(
        workdir, mirror_dirs=[kernel_mirror], config={"resolve": {"lease_max": "1h"}}
    ) as d:
        yield d


@pytest.fixture
def kernels(daemon: DaemonProcess) -> Iterator[KernelsStub]:
    with daemon.kernels() as stub:
        yield stub


def test_health_on_both_sockets(daemon: DaemonProcess) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert daemon.health(daemon.user_socket, "") == serving
    assert daemon.health(daemon.user_socket, KERNELS_SERVICE) == serving
    assert daemon.health(daemon.admin_socket, "") == serving
    assert daemon.health(daemon.admin_socket, ADMIN_SERVICE) == serving


def _reflect(channel: grpc.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=TIMEOUT
    )
    return [s.name for r in replies for s in r.list_services_response.service]


def test_reflection_only_on_the_admin_socket(daemon: DaemonProcess) -> None:
    with daemon.channel(admin=True) as channel:
        assert ADMIN_SERVICE in _reflect(channel)
    with daemon.channel() as channel, pytest.raises(grpc.RpcError) as info:
        _reflect(channel)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_advert_names_the_store(daemon: DaemonProcess) -> None:
    advert = read_advert(daemon.user_socket)
    assert advert is not None
    assert advert.pid == daemon.pid
    assert advert.store_root == daemon.store_root
    assert advert.index_dir.is_dir() and advert.index_dir == daemon.store_root / "index" / "v1"
    assert advert.admin_socket == daemon.admin_socket


def test_socket_modes(daemon: DaemonProcess) -> None:
    for path in (daemon.user_socket, daemon.admin_socket):
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600  # user-mode defaults: owner only
        assert st.st_uid == daemon.uid
        if os.geteuid() == 0:  # nobody else may even connect
            nobody = pwd.getpwnam("nobody")
            assert connect_as(path, nobody.pw_uid, nobody.pw_gid) == errno.EACCES


def test_miss_then_hit(daemon: DaemonProcess, kernels: KernelsStub) -> None:
    first = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    assert first.fetched and first.upstream == "cli-mirror-0"
    assert (first.repo_id, first.ref, first.commit) == (ACT, "v1", C1)
    assert first.variant == "torch213-cxx11-cpu-x86_64-linux"
    path = Path(first.path)
    assert path.parent == daemon.store_root / "v1" / "trees"
    assert tree_files(path) == mirror_kernels()[ACT][C1][first.variant]
    assert not os.access(path / "metadata.json", os.W_OK) or os.geteuid() == 0
    assert stat.S_IMODE(os.stat(path / "metadata.json").st_mode) & 0o222 == 0  # read-only
    assert first.tree_digest.startswith("sha256:")
    assert first.lease.id and first.lease.expires_at.seconds > time.time()
    assert first.metadata.id == "_act_cpu213" and first.metadata.backend_type == "cpu"
    assert [(v.variant, v.accepted, v.rank, v.cached) for v in first.variants] == [
        ("torch213-cxx11-cpu-x86_64-linux", True, 0, True),
        ("torch-universal", True, 1, False),
    ]

    again = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    assert not again.fetched and again.upstream == ""
    assert again.path == first.path and again.tree_digest == first.tree_digest
    assert again.lease.id != first.lease.id

    # The same kernel by commit and by locked commit: no ref, same tree.
    for kernel_ref in (ref(ACT, revision=C1), ref(ACT, locked=C1)):
        request = pb.ResolveRequest(kernel=kernel_ref, platform=CPU, allow_fetch=False)
        by_commit = kernels.Resolve(request, timeout=TIMEOUT).kernel
        assert by_commit.path == first.path and by_commit.ref == ""


def test_client_index_is_published(daemon: DaemonProcess, kernels: KernelsStub) -> None:
    hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    advert = read_advert(daemon.user_socket)
    assert advert is not None
    doc = json.loads((advert.index_dir / "kerneld-test" / "act.json").read_text())
    assert doc["refs"]["v1"]["commit"] == C1
    published = doc["commits"][C1]["variants"][hit.variant]
    assert daemon.store_root / published["tree"] == Path(hit.path)


def test_cuda_client_gets_the_newest_build_its_cuda_runs(kernels: KernelsStub) -> None:
    kernel = kernels.Resolve(resolve_req(ACT, 2, platform=CUDA129), timeout=TIMEOUT).kernel
    assert kernel.variant == "torch213-cxx11-cu128-x86_64-linux"
    rejected = {v.variant: v.reason for v in kernel.variants if not v.accepted}
    assert "CUDA 13.0" in rejected["torch213-cxx11-cu130-x86_64-linux"]


def test_forced_variant(kernels: KernelsStub) -> None:
    request = resolve_req(ACT, 1, variant="torch-universal")
    kernel = kernels.Resolve(request, timeout=TIMEOUT).kernel
    assert kernel.variant == "torch-universal" and kernel.metadata.id == "_act_universal"


def test_no_compatible_variant_lists_every_reason(kernels: KernelsStub) -> None:
    code, detail = failure(kernels.Resolve, resolve_req(ACT, 2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert detail.code == E.NO_COMPATIBLE_VARIANT
    assert (detail.repo_id, detail.revision) == (ACT, C2)
    assert {v.variant for v in detail.variants} == {
        "torch213-cxx11-cu128-x86_64-linux",
        "torch213-cxx11-cu130-x86_64-linux",
    }
    assert all(not v.accepted and "CPU" in v.reason and v.rank == -1 for v in detail.variants)
    assert detail.hint


def test_denied_kernel_is_refused(daemon: DaemonProcess, kernels: KernelsStub) -> None:
    with daemon.admin() as admin:
        admin.Deny(pb.DenyRequest(repo_id=ACT, reason="bad build"), timeout=TIMEOUT)
        try:
            code, detail = failure(kernels.Resolve, resolve_req(ACT, 1))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert detail.code == E.KERNEL_DENIED
            assert "bad build" in detail.message and detail.repo_id == ACT
            assert "kerneldctl allow" in detail.hint
        finally:
            admin.Allow(pb.DenyRequest(repo_id=ACT), timeout=TIMEOUT)
    assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.commit == C1


def test_no_fetch_when_the_caller_forbids_it(kernels: KernelsStub) -> None:
    code, detail = failure(kernels.Resolve, resolve_req(MULTI, 1, allow_fetch=False))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert detail.code == E.FETCH_NOT_ALLOWED and detail.repo_id == MULTI


def test_not_found_and_invalid_arguments(kernels: KernelsStub) -> None:
    code, detail = failure(kernels.Resolve, resolve_req("kerneld-test/absent", 1))
    assert (code, detail.code) == (grpc.StatusCode.NOT_FOUND, E.KERNEL_NOT_FOUND)
    code, detail = failure(kernels.Resolve, resolve_req(ACT, 9))
    assert (code, detail.code) == (grpc.StatusCode.NOT_FOUND, E.REVISION_NOT_FOUND)
    for bad in (
        resolve_req("no-slash", 1),
        resolve_req("", 1),
        resolve_req(ACT, 1, platform=None),
        pb.ResolveRequest(kernel=ref(ACT, locked="abc"), platform=CPU),
        resolve_req(ACT, 1, platform=pb.PlatformFacts(cpu="x86_64", os="linux", torch_version="x")),
    ):
        code, detail = failure(kernels.Resolve, bad)
        assert (code, detail.code) == (grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_ARGUMENT), bad


def test_dependencies_come_with_their_own_paths_and_leases(kernels: KernelsStub) -> None:
    kernel = kernels.Resolve(resolve_req(DEP_TOP, 1), timeout=TIMEOUT).kernel
    assert [d.repo_id for d in kernel.dependencies] == [DEP_BOTTOM]
    dep = kernel.dependencies[0]
    assert Path(dep.path).is_dir() and dep.lease.id and dep.lease.id != kernel.lease.id
    assert [d.repo_id for d in kernel.metadata.kernel_depends] == [DEP_BOTTOM]


def test_resolve_many_answers_each_on_its_own(kernels: KernelsStub) -> None:
    reply = kernels.ResolveMany(
        pb.ResolveManyRequest(
            requests=[
                resolve_req(ACT, 1),
                resolve_req(ACT, 2),
                resolve_req("kerneld-test/absent", 1),
                resolve_req(ACT, 2, platform=CUDA129),
            ]
        ),
        timeout=TIMEOUT,
    )
    kinds = [r.WhichOneof("result") for r in reply.results]
    assert kinds == ["kernel", "error", "error", "kernel"]
    assert reply.results[0].kernel.variant == "torch213-cxx11-cpu-x86_64-linux"
    assert reply.results[1].error.code == E.NO_COMPATIBLE_VARIANT
    assert len(reply.results[1].error.variants) == 2
    assert reply.results[2].error.code == E.KERNEL_NOT_FOUND
    assert reply.results[3].kernel.variant == "torch213-cxx11-cu128-x86_64-linux"


def test_list_variants_fetches_no_content(daemon: DaemonProcess, kernels: KernelsStub) -> None:
    reply = kernels.ListVariants(
        pb.ListVariantsRequest(kernel=ref(MULTI, 1), platform=facts((2, 12)), allow_fetch=True),
        timeout=TIMEOUT,
    )
    assert reply.commit == C1 and not reply.stale
    accepted = [v.variant for v in reply.variants if v.accepted]
    assert accepted == ["torch212-cxx11-cpu-x86_64-linux", "torch-cpu", "torch-universal"]
    assert not any(v.cached for v in reply.variants)
    with daemon.admin() as admin:
        listing = admin.List(pb.ListRequest(repo_ids=[MULTI]), timeout=TIMEOUT)
    assert all(not rev.variants for k in listing.kernels for rev in k.revisions)


def test_leases_renew_release_and_cap(kernels: KernelsStub) -> None:
    request = resolve_req(ACT, 1, lease_seconds=10**6)
    lease = kernels.Resolve(request, timeout=TIMEOUT).kernel.lease
    assert lease.expires_at.seconds <= time.time() + 3600 + 5  # capped at lease_max = 1h
    renewed = kernels.RenewLease(
        pb.RenewLeaseRequest(lease_id=lease.id, lease_seconds=60), timeout=TIMEOUT
    )
    assert renewed.id == lease.id
    assert abs(renewed.expires_at.seconds - (time.time() + 60)) < 5
    kernels.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.id), timeout=TIMEOUT)
    code, detail = failure(kernels.RenewLease, pb.RenewLeaseRequest(lease_id=lease.id))
    assert code == grpc.StatusCode.NOT_FOUND and "resolve" in detail.hint
    # Releasing twice is harmless.
    kernels.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.id), timeout=TIMEOUT)


def test_get_status(daemon: DaemonProcess, kernels: KernelsStub) -> None:
    kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
    status = kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
    assert status.ready and status.version
    assert Path(status.store_root) == daemon.store_root
    assert Path(status.index_path).is_dir() and status.index_format == 1
    assert status.trees >= 1 and status.blobs >= 2 and status.store_bytes > 0
    assert 0 < time.time() - status.started_at.seconds < 600
    (up,) = status.upstreams
    assert (up.name, up.kind, up.priority, up.reachable) == ("cli-mirror-0", "mirror-dir", 0, True)
    assert up.last_success.seconds > 0
    assert status.host_platforms[0].backend.type == "cpu"
