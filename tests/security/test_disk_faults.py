"""The store's file system fails under a running daemon: it fills up during a prefetch, or a
disk error remounts it read-only. The daemon keeps serving what it has, fails the rest with
typed errors that say what to do, loses nothing, and recovers when the disk does.

Real file systems: a small tmpfs, and a loop-mounted ext4 with errors=remount-ro whose error
is triggered through /sys (the kernel then remounts it read-only with the daemon's files open,
exactly as after a real I/O error). Mounting needs root; without it the tests skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, failure, ref, resolve_req
from tests.fixtures_daemon import ACT, DEP_BOTTOM
from tests.security.support import CPU_FACTS, ext4_error, fill, mount_ext4, mount_tmpfs, umount
from tests.support.daemon import DaemonProcess
from tests.support.mirrors import variant, write_mirror

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting file systems needs root")

K = pb.PrefetchEvent
C = "5" * 40
SERVING = 1


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "tmpfs"
    if not mount_tmpfs(where, "3m"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount)")
    yield where
    umount(where)


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    where = tmp_path / "ext4"
    device = mount_ext4(where, tmp_path / "fs.img", 32 << 20)
    if device is None or not Path(f"/sys/fs/ext4/{device}/trigger_fs_error").exists():
        umount(where)
        pytest.skip("cannot loop-mount ext4 with a triggerable error here")
    yield where, device
    umount(where)


def _sized_mirror(root: Path) -> Path:
    repos = {
        f"kerneld-sec/{name}": {
            C: {"torch-universal": variant(f"_sec_{name}", extra={"blob.bin": os.urandom(size)})}
        }
        for name, size in (("small", 256 << 10), ("mid", 1 << 20), ("big", 4 << 20))
    }
    write_mirror(root, repos, branches={repo: {"v1": C} for repo in repos})
    return root


def _leftovers(store: Path) -> list[str]:
    tmp = store / "v1" / "tmp"
    return [str(p) for d in ("ingest", "staging", "trash") for p in (tmp / d).iterdir()]


def test_a_store_that_fills_up_during_prefetch(
    make_daemon: Callable[..., DaemonProcess], tmpfs: Path, tmp_path: Path
) -> None:
    mirror = _sized_mirror(tmp_path / "mirror")
    d = make_daemon(
        mirror_dirs=[mirror], store=tmpfs / "store", config={"store": {"gc_min_age": "1h"}}
    )
    small, mid, big = (f"kerneld-sec/{n}" for n in ("small", "mid", "big"))
    with d.admin() as admin, d.kernels() as kernels:
        # 1) The space reservation sees the real free space: what fits is fetched, what does not
        #    fails alone with a typed error; nothing half-written is left.
        request = pb.PrefetchRequest(kernels=[ref(small, 1), ref(big, 1)], variants=["all"])
        events = list(admin.Prefetch(request, timeout=TIMEOUT))
        failed = [e for e in events if e.kind == K.KERNEL_FAILED]
        assert [(e.repo_id, e.error.code) for e in failed] == [(big, pb.RESOURCE_EXHAUSTED)]
        assert "free disk space" in failed[0].error.message
        assert (events[-1].kernels_ok, events[-1].kernels_failed) == (1, 1)
        assert _leftovers(d.store_root) == []

        # 2) Something else fills the file system behind the daemon's back: SQLite and the
        #    blob writer hit ENOSPC. Cached kernels are still served; a new one fails typed.
        fill(tmpfs / "filler")
        assert kernels.Resolve(resolve_req(small, 1), timeout=TIMEOUT).kernel.path
        code, detail = failure(kernels.Resolve, resolve_req(mid, 1))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, detail
        assert detail.code == pb.RESOURCE_EXHAUSTED and "file system is full" in detail.hint
        assert d.health() == SERVING
        assert "Traceback" not in d.logs()  # a full disk is an expected fault, not a crash

        # 3) Space comes back: the same daemon fetches the big kernel; the store is intact.
        (tmpfs / "filler").unlink()
        subprocess.run(["mount", "-o", "remount,size=16m", str(tmpfs)], check=True, timeout=30)
        assert kernels.Resolve(resolve_req(big, 1), timeout=TIMEOUT).kernel.fetched
        assert kernels.Resolve(resolve_req(mid, 1), timeout=TIMEOUT).kernel.fetched
        verify = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in verify] == [pb.VerifyEvent.SUMMARY], verify
        assert verify[0].trees_checked == 3
    assert _leftovers(d.store_root) == []


def test_a_store_remounted_read_only_after_a_disk_error(
    make_daemon: Callable[..., DaemonProcess],
    kernel_mirror: Path,
    ext4: tuple[Path, str],
    tmp_path: Path,
) -> None:
    where, device = ext4
    d = make_daemon(mirror_dirs=[kernel_mirror], store=where / "store")
    with d.kernels() as kernels, d.admin() as admin:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
        ext4_error(device)
        with pytest.raises(OSError, match="Read-only file system"):
            (where / "probe").write_text("x")

        # What is cached is still served, over the socket and on the warm path.
        again = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
        assert again.path == hit.path
        env = client_env(
            d.store_root,
            tmp_path,
            KERNELD_SOCKET=str(d.user_socket),
            KERNELD_PLATFORM_JSON=CPU_FACTS,
            KERNELD_VERIFY="1",
        )
        code = f"""
import json, torch, kerneld_client
mod = kerneld_client.get_kernel({ACT!r}, version=1, policy="error")
print(json.dumps({{"name": mod.NAME, "source": kerneld_client.loaded_kernels()[0].source}}))
"""
        assert run_client(code, env)["source"] == "index"
        # A download cannot be stored: a typed failure that says what happened and what to do.
        status, detail = failure(kernels.Resolve, resolve_req(DEP_BOTTOM, 1))
        assert status == grpc.StatusCode.INTERNAL
        assert detail.message.startswith("store I/O fault") and "dmesg" in detail.hint
        assert d.health() == SERVING
        # Verification only reads: it still works.
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in events] == [pb.VerifyEvent.SUMMARY]
    assert "Traceback" not in d.logs()
    # Stopping loses nothing; starting on the read-only store fails with the reason.
    assert d.stop() == 0
    d.spawn()
    assert d.wait(timeout=30) == 1
    assert "file system is read-only" in d.logs().splitlines()[-1]
