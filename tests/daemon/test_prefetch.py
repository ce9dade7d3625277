"""Prefetch in a real daemon: at start for the detected GPUs, on a timer (moved refs), and for the
platforms clients have shown."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon import fakehosts
from tests.daemon.rpc import TIMEOUT, facts, ref, resolve_req
from tests.fixtures_daemon import ACT, C1, C3, MULTI, mirror_kernels
from tests.fixtures_hub import REPO
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.hubserver import HubServer
from tests.support.mirrors import variant, write_mirror


def variants_in_store(d: DaemonProcess, repo: str) -> dict[str, set[str]]:
    with d.admin() as admin:
        listing = admin.List(pb.ListRequest(repo_ids=[repo]), timeout=TIMEOUT)
    return {r.commit: {v.variant for v in r.variants} for k in listing.kernels for r in k.revisions}


def test_start_prefetches_what_the_detected_gpus_run(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        hardware_root=fakehosts.nvidia(tmp_path / "host", driver="570.86.15"),
        config={"prefetch": {"kernels": [f"{MULTI}:1"], "torch": ["2.13"]}},
    )
    d.wait_for_log("scheduled prefetch done")
    assert variants_in_store(d, MULTI)[C1] == {
        "torch213-cxx11-cpu-x86_64-linux",
        "torch213-cxx11-cu126-x86_64-linux",
        "torch213-cxx11-cu128-x86_64-linux",
        "torch-cpu",
        "torch-cuda",
    }
    with d.kernels() as kernels:
        status = kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
    cuda = [p for p in status.host_platforms if p.backend.type == "cuda"]
    assert [(p.backend.version, p.torch_version, list(p.device_capabilities)) for p in cuda] == [
        ("12.8", "2.13", ["9.0"])
    ]


def test_readiness_does_not_wait_for_prefetch(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer
) -> None:
    hub_server.latency_s = 0.3
    d = make_daemon(hub_endpoint=hub_server.url, config={"prefetch": {"kernels": [f"{REPO}:1"]}})
    assert "scheduled prefetch done" not in d.logs()  # ready, while the Hub is still slow
    hub_server.latency_s = 0
    d.wait_for_log("scheduled prefetch done")
    with d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(REPO, 1, allow_fetch=False), timeout=TIMEOUT).kernel
    assert not hit.fetched


def test_timer_fetches_a_moved_version_branch(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    mirror = tmp_path / "mirror"
    kernels = {ACT: {C1: mirror_kernels()[ACT][C1]}}
    write_mirror(mirror, kernels, branches={ACT: {"v1": C1}})
    d = make_daemon(
        mirror_dirs=[mirror],
        hardware_root=fakehosts.cpu_only(tmp_path / "host"),
        config={
            "prefetch": {"kernels": [f"{ACT}:1"], "torch": ["2.13"], "interval": "1s"},
            "resolve": {"ref_ttl": "1h"},
        },
    )
    d.wait_for_log("scheduled prefetch done")
    assert variants_in_store(d, ACT) == {C1: {"torch213-cxx11-cpu-x86_64-linux", "torch-universal"}}
    with d.kernels() as stub:  # a client resolves v1 now: the daemon remembers the answer
        before = stub.Resolve(resolve_req(ACT, 1, allow_fetch=False), timeout=TIMEOUT).kernel
    assert before.commit == C1
    # The publisher moves v1 to a new build; the next timer run picks it up.
    kernels[ACT][C3] = {"torch213-cxx11-cpu-x86_64-linux": variant("_act_cpu213_v1_1")}
    write_mirror(mirror, kernels, branches={ACT: {"v1": C3}})
    # The ref moves once the new commit's trees are in (not when the first one is): wait for it.
    with d.kernels() as stub:

        def v1() -> pb.ResolvedKernel:
            return stub.Resolve(resolve_req(ACT, 1, allow_fetch=False), timeout=TIMEOUT).kernel

        wait_until(lambda: v1().commit == C3, d)
        kernel = v1()
    assert variants_in_store(d, ACT)[C3] == {"torch213-cxx11-cpu-x86_64-linux"}
    assert not kernel.fetched and kernel.metadata.id == "_act_cpu213_v1_1"


def test_client_platforms_drive_auto_prefetch(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], hardware_root=fakehosts.cpu_only(tmp_path / "h"))
    with d.kernels() as kernels, d.admin() as admin:
        kernels.Resolve(resolve_req(ACT, 1, platform=facts((2, 12))), timeout=TIMEOUT)
        events = list(admin.Prefetch(pb.PrefetchRequest(kernels=[ref(MULTI, 1)]), timeout=TIMEOUT))
    done = {e.variant for e in events if e.kind == pb.PrefetchEvent.VARIANT_DONE}
    # The client ran torch 2.12 on CPU: its build and the CPU noarch fallback.
    assert done == {"torch212-cxx11-cpu-x86_64-linux", "torch-cpu"}
    saved = json.loads((d.store_root / "daemon" / "platforms.json").read_text())
    assert [p["facts"]["torch_version"] for p in saved["platforms"]] == ["2.12"]
    # Remembered across a restart.
    d.restart()
    with d.admin() as admin:
        events = list(admin.Prefetch(pb.PrefetchRequest(kernels=[ref(MULTI, 1)]), timeout=TIMEOUT))
    present = {e.variant for e in events if e.kind == pb.PrefetchEvent.VARIANT_DONE}
    assert present == done


def test_a_prefetch_over_the_cap_keeps_what_it_reports_and_says_why_not_the_rest(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Issue 19: under a cap that holds two of three variants, the old code let the third's
    reservation evict the first right after its fetch (and answered INTERNAL when it looked it
    up). Every variant reported done must still be in the store at the end; the one that does
    not fit fails with a typed RESOURCE_EXHAUSTED, and the daemon logs no internal error."""
    mirror = tmp_path / "mirror"
    names = ("torch-cpu", "torch-universal", "torch213-cxx11-cpu-x86_64-linux")
    kernels = {
        ACT: {
            C1: {
                name: variant(f"_big_{i}", extra={"payload.bin": bytes([i]) * 60_000})
                for i, name in enumerate(names)
            }
        }
    }
    write_mirror(mirror, kernels, branches={ACT: {"v1": C1}})
    d = make_daemon(
        mirror_dirs=[mirror],
        hardware_root=fakehosts.cpu_only(tmp_path / "host"),
        config={"store": {"cap": "150KB", "gc_min_age": "0s", "orphan_grace": "0s"}},
    )
    with d.admin() as admin:
        events = list(
            admin.Prefetch(
                pb.PrefetchRequest(kernels=[ref(ACT, 1)], variants=["all"]), timeout=TIMEOUT
            )
        )
    done = {e.variant for e in events if e.kind == pb.PrefetchEvent.VARIANT_DONE}
    failed = [e for e in events if e.kind == pb.PrefetchEvent.KERNEL_FAILED]
    assert len(done) == 2, events
    assert [e.error.code for e in failed] == [pb.RESOURCE_EXHAUSTED], failed
    assert "size cap" in failed[0].error.message
    assert variants_in_store(d, ACT) == {C1: done}
    assert "internal error" not in d.logs()
