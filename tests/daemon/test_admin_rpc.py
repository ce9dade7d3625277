"""The Admin service of a real daemon over its admin socket."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto.kerneld_pb2_grpc import AdminStub
from tests.daemon.rpc import CPU, TIMEOUT, failure, ref, resolve_req
from tests.fixtures_daemon import ACT, C1, DEP_BOTTOM, DEP_TOP, MULTI
from tests.support.daemon import DaemonProcess

E = pb.ErrorCode
K = pb.PrefetchEvent
ACT_VARIANTS = {"torch213-cxx11-cpu-x86_64-linux", "torch-universal"}


@pytest.fixture(scope="module")
def daemon(
    kernel_mirror: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    with DaemonProcess(tmp_path_factory.mktemp("admin-rpc"), mirror_dirs=[kernel_mirror]) as d:
        yield d


@pytest.fixture
def admin(daemon: DaemonProcess) -> Iterator[AdminStub]:
    with daemon.admin() as stub:
        yield stub


def prefetch(
    admin: AdminStub, *kernels: pb.KernelRef, variants: tuple[str, ...] = ("all",)
) -> list[pb.PrefetchEvent]:
    request = pb.PrefetchRequest(kernels=list(kernels), variants=list(variants))
    return list(admin.Prefetch(request, timeout=TIMEOUT))


def test_prefetch_streams_progress_then_finds_it_present(admin: AdminStub) -> None:
    events = prefetch(admin, ref(ACT, 1))
    kinds = [e.kind for e in events]
    assert kinds[0] == K.KERNEL_STARTED and events[0].commit == C1
    assert kinds[-2:] == [K.KERNEL_DONE, K.FINISHED]
    assert (events[-1].kernels_ok, events[-1].kernels_failed) == (1, 0)
    done = [e for e in events if e.kind == K.VARIANT_DONE]
    assert {e.variant for e in done} == ACT_VARIANTS
    assert all(Path(e.path).is_dir() and e.tree_digest.startswith("sha256:") for e in done)
    files = [e for e in events if e.kind == K.FILE_DONE]
    assert files and all(e.bytes_total > 0 and e.files_total == 2 for e in files)
    assert {e.path for e in files} == {"__init__.py", "metadata.json"}
    last = {e.variant: e for e in files}
    assert all(e.bytes_done == e.bytes_total and e.files_done == 2 for e in last.values())
    assert any(e.kind == K.FILE_PROGRESS and e.bytes_total > 0 for e in events)

    again = prefetch(admin, ref(ACT, 1))
    done = [e for e in again if e.kind == K.VARIANT_DONE]
    assert {e.variant for e in done} == ACT_VARIANTS and all(e.already_present for e in done)
    assert not any(e.kind == K.FILE_DONE for e in again)


def test_prefetch_failure_does_not_stop_the_others(admin: AdminStub) -> None:
    events = prefetch(admin, ref("kerneld-test/absent", 1), ref(DEP_TOP, 1), variants=())
    failed = [e for e in events if e.kind == K.KERNEL_FAILED]
    assert [(e.repo_id, e.error.code) for e in failed] == [
        ("kerneld-test/absent", E.KERNEL_NOT_FOUND)
    ]
    done = [e.repo_id for e in events if e.kind == K.KERNEL_DONE]
    assert done == [DEP_TOP, DEP_BOTTOM]  # kernel-depends are prefetched too
    assert (events[-1].kind, events[-1].kernels_ok, events[-1].kernels_failed) == (K.FINISHED, 2, 1)


def test_prefetch_explicit_variant_that_does_not_exist(admin: AdminStub) -> None:
    events = prefetch(admin, ref(ACT, 1), variants=("torch-universal", "torch299-cpu"))
    failed = [e for e in events if e.kind == K.KERNEL_FAILED]
    assert [e.variant for e in failed] == ["torch299-cpu"]
    assert [e.variant for e in events if e.kind == K.VARIANT_DONE] == ["torch-universal"]


def test_prefetch_needs_kernels(admin: AdminStub) -> None:
    code, detail = failure(admin.Prefetch, pb.PrefetchRequest())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "[prefetch] kernels" in detail.message
    code, _ = failure(
        admin.Prefetch, pb.PrefetchRequest(kernels=[ref(ACT, 1)], torch_versions=["2"])
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_list_pin_unpin(admin: AdminStub) -> None:
    prefetch(admin, ref(ACT, 1))
    pinned = admin.Pin(pb.PinRequest(kernel=ref(ACT, 1), reason="prod"), timeout=TIMEOUT)
    assert (pinned.commit, pinned.trees) == (C1, 2)
    try:
        (kernel,) = admin.List(pb.ListRequest(repo_ids=[ACT]), timeout=TIMEOUT).kernels
        assert kernel.repo_id == ACT and not kernel.pinned and not kernel.denied
        rev = next(r for r in kernel.revisions if r.commit == C1)
        assert set(rev.refs) == {"v1"} and rev.pinned
        assert {v.variant for v in rev.variants} == ACT_VARIANTS
        for v in rev.variants:
            assert v.pinned and v.size_bytes > 0 and v.files == 2 and Path(v.path).is_dir()
            assert v.tree_digest.startswith("sha256:") and v.last_resolved.seconds > 0
    finally:
        unpinned = admin.Unpin(pb.PinRequest(kernel=ref(ACT, 1)), timeout=TIMEOUT)
    assert unpinned.commit == C1
    (kernel,) = admin.List(pb.ListRequest(repo_ids=[ACT]), timeout=TIMEOUT).kernels
    assert not any(v.pinned for r in kernel.revisions for v in r.variants)


def test_deny_allow_list_denies(admin: AdminStub) -> None:
    # A deny by ref is resolved to the commit the ref names, and says so.
    request = pb.DenyRequest(repo_id=MULTI, revision="v1", reason="crashes on H100")
    answer = admin.Deny(request, timeout=TIMEOUT)
    assert answer.changed and (answer.revision, answer.kind, answer.resolved_from) == (
        C1,
        "commit",
        "v1",
    )
    assert not admin.Deny(request, timeout=TIMEOUT).changed  # same deny again
    try:
        denies = admin.ListDenies(pb.ListDeniesRequest(), timeout=TIMEOUT).denies
        (entry,) = [d for d in denies if d.repo_id == MULTI]
        assert (entry.revision, entry.reason, entry.kind) == (C1, "crashes on H100", "commit")
        assert C1 in entry.meaning and "any branch, tag or the sha" in entry.meaning
        assert abs(entry.created_at.seconds - time.time()) < 60
        events = prefetch(admin, ref(MULTI, 1))
        assert events[0].kind == K.KERNEL_FAILED and events[0].error.code == E.KERNEL_DENIED
    finally:
        allowed = admin.Allow(pb.DenyRequest(repo_id=MULTI, revision="v1"), timeout=TIMEOUT)
        assert allowed.changed and allowed.revision == C1
    assert not admin.Allow(pb.DenyRequest(repo_id=MULTI, revision="v1"), timeout=TIMEOUT).changed
    code, _ = failure(admin.Deny, pb.DenyRequest())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # A ref that neither the upstreams nor the store know is refused, with what to do.
    code, detail = failure(admin.Deny, pb.DenyRequest(repo_id=MULTI, revision="no-such-ref"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "--ref" in detail.message, detail


def test_admin_status(daemon: DaemonProcess, admin: AdminStub) -> None:
    with daemon.kernels() as kernels:
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
    prefetch(admin, ref(DEP_BOTTOM, 1))
    status = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
    assert status.status.ready and status.status.trees >= 2
    assert status.active_leases >= 1
    assert any(r.repo_id == ACT and r.ref == "v1" and r.commit == C1 for r in status.refs)
    assert any(f.repo_id in (ACT, DEP_BOTTOM) and f.bytes > 0 for f in status.recent_fetches)


def test_reload_config_rpc(daemon: DaemonProcess, admin: AdminStub) -> None:
    daemon.write_config({"fetch": {"allow": ["someone-else/*"]}})
    try:
        reply = admin.ReloadConfig(pb.ReloadConfigRequest(), timeout=TIMEOUT)
        assert reply.changed and "[fetch] allow" in reply.detail  # kerneld.toml's name
        with daemon.kernels() as kernels:
            code, detail = failure(kernels.Resolve, resolve_req(MULTI, 1))
        assert code == grpc.StatusCode.PERMISSION_DENIED and detail.code == E.FETCH_NOT_ALLOWED
        assert "fetch policy" in detail.message
        # An invalid file is refused with file and key; the running config stays.
        daemon.config_path.write_text("[fetch]\nattempts = 0\n")
        code, detail = failure(admin.ReloadConfig, pb.ReloadConfigRequest())
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert str(daemon.config_path) in detail.message and "fetch.attempts" in detail.message
    finally:
        daemon.write_config({"fetch": {"allow": ["*"]}})
        admin.ReloadConfig(pb.ReloadConfigRequest(), timeout=TIMEOUT)
    with daemon.kernels() as kernels:
        assert kernels.Resolve(resolve_req(MULTI, 1), timeout=TIMEOUT).kernel.fetched


# ---- GC and verification (own daemons: they change the whole store) ---------------------------


def test_gc_keeps_pinned_and_leased_trees(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror])
    with d.admin() as admin, d.kernels() as kernels:
        prefetch(admin, ref(ACT, 1))
        prefetch(admin, ref(MULTI, 1), variants=("torch-cpu", "torch-rocm"))
        admin.Pin(pb.PinRequest(kernel=ref(ACT, 1), variant="torch-universal"), timeout=TIMEOUT)
        leased = kernels.Resolve(resolve_req(MULTI, 1, variant="torch-cpu"), timeout=TIMEOUT).kernel

        plan = admin.GarbageCollect(
            pb.GcRequest(dry_run=True, target_free_bytes=1 << 60), timeout=TIMEOUT
        )
        assert plan.dry_run
        removed = {i.variant for i in plan.removed}
        kept = {i.variant: i.reason for i in plan.kept}
        assert removed == {"torch213-cxx11-cpu-x86_64-linux", "torch-rocm"}
        assert "pinned" in kept["torch-universal"] and "lease" in kept["torch-cpu"]
        assert all(Path(i.tree_digest) for i in plan.removed)
        listing = admin.List(pb.ListRequest(), timeout=TIMEOUT)
        assert sum(len(r.variants) for k in listing.kernels for r in k.revisions) == 4

        done = admin.GarbageCollect(pb.GcRequest(target_free_bytes=1 << 60), timeout=TIMEOUT)
        assert {i.variant for i in done.removed} == removed and done.freed_bytes > 0
        assert done.orphan_blobs_removed >= 2
        assert Path(leased.path).is_dir()
        listing = admin.List(pb.ListRequest(), timeout=TIMEOUT)
        left = {v.variant for k in listing.kernels for r in k.revisions for v in r.variants}
        assert left == {"torch-universal", "torch-cpu"}
        # A plain GC (no pressure, nothing unreferenced) removes nothing.
        assert not admin.GarbageCollect(pb.GcRequest(), timeout=TIMEOUT).removed


def test_verify_finds_and_repairs_corruption(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror])
    with d.admin() as admin, d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in events] == [pb.VerifyEvent.SUMMARY]
        assert events[0].exit_mask == 0 and events[0].trees_checked == 1
        assert events[0].blobs_checked == 2

        init = Path(hit.path) / "__init__.py"
        os.chmod(init, 0o644)
        init.write_text("import os; os.system('evil')\n")
        os.chmod(init, 0o444)
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert pb.VerifyEvent.CORRUPT in [e.problem for e in events]
        assert events[-1].problem == pb.VerifyEvent.SUMMARY and events[-1].exit_mask & 1

        filtered = list(
            admin.Verify(pb.VerifyRequest(tree_digests=["sha256:" + "0" * 64]), timeout=TIMEOUT)
        )
        assert [e.problem for e in filtered] == [pb.VerifyEvent.SUMMARY]

        repaired = list(admin.Verify(pb.VerifyRequest(repair=True), timeout=TIMEOUT))
        assert pb.VerifyEvent.REPAIRED in [e.problem for e in repaired]
        clean = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in clean] == [pb.VerifyEvent.SUMMARY] and clean[0].exit_mask == 0
        again = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
        assert again.fetched  # the broken tree was dropped: fetched afresh
        assert (Path(again.path) / "__init__.py").read_text() != "import os; os.system('evil')\n"


def test_mirror_export_then_import_into_another_daemon(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    from kerneld.mirror.receive import ExportReceiver

    source = make_daemon("source", mirror_dirs=[kernel_mirror])
    with source.admin() as admin:
        prefetch(admin, ref(ACT, 1))
        events = list(
            admin.MirrorExport(
                pb.MirrorExportRequest(destination=str(tmp_path / "export"), kernels=[ref(ACT, 1)]),
                timeout=TIMEOUT,
            )
        )
    assert events[-1].kind == pb.MirrorEvent.FINISHED and events[-1].manifests == 1
    # The daemon writes nothing itself: the caller writes the files it streams.
    assert not (tmp_path / "export").exists()
    file_kinds = {pb.MirrorEvent.FILE: "file", pb.MirrorEvent.DATA: "data"}
    with ExportReceiver(tmp_path / "export") as receiver:
        for e in events:
            if e.kind in file_kinds:
                receiver.handle(file_kinds[e.kind], e.path, e.bytes_total, e.data)
        receiver.commit()

    # An air-gapped daemon whose only upstream is an empty mirror imports the export.
    empty = tmp_path / "empty-mirror"
    from tests.support.mirrors import write_mirror

    write_mirror(empty, {})
    target = make_daemon("target", mirror_dirs=[empty])
    with target.admin() as admin, target.kernels() as kernels:
        code, _ = failure(kernels.Resolve, resolve_req(ACT, 1))
        assert code == grpc.StatusCode.NOT_FOUND
        events = list(
            admin.MirrorImport(
                pb.MirrorImportRequest(source=str(tmp_path / "export"), no_check_sigs=True),
                timeout=TIMEOUT,
            )
        )
        assert events[-1].kind == pb.MirrorEvent.FINISHED
        kernel = kernels.Resolve(resolve_req(ACT, 1, allow_fetch=False), timeout=TIMEOUT).kernel
        assert kernel.commit == C1 and not kernel.fetched
        code, _ = failure(admin.MirrorImport, pb.MirrorImportRequest(source=str(tmp_path / "nope")))
        assert code != grpc.StatusCode.OK
    assert "WITHOUT signature checks" in target.logs()


def test_admin_mutations_are_logged_one_line_each(daemon: DaemonProcess, admin: AdminStub) -> None:
    admin.Deny(pb.DenyRequest(repo_id=DEP_TOP, reason="audit"), timeout=TIMEOUT)
    admin.Allow(pb.DenyRequest(repo_id=DEP_TOP), timeout=TIMEOUT)
    logs = daemon.wait_for_log(f"admin: allow repo={DEP_TOP}")
    lines = [line for line in logs.splitlines() if f"repo={DEP_TOP}" in line and "admin:" in line]
    assert any("admin: deny" in line and "reason=audit" in line for line in lines)
    assert any("admin: allow" in line and "changed=True" in line for line in lines)


def test_unready_calls_are_typed(admin: AdminStub) -> None:
    """Sanity: an RPC against a missing kernel in ListVariants maps to NOT_FOUND too."""
    with pytest.raises(grpc.RpcError):
        admin.Pin(pb.PinRequest(kernel=ref("kerneld-test/absent", 1)), timeout=TIMEOUT)


_ = CPU
