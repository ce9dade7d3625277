"""Who may talk to which socket (file mode and group are the access control), and metrics."""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT, connect_as, failure, http_get_unix, metric, resolve_req
from tests.fixtures_daemon import ACT
from tests.security.support import as_user
from tests.support.daemon import REPO_ROOT, DaemonProcess, clean_env, daemon_dir

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

#: Run by another user: one RPC on each socket, print the outcome.
PROBE = """
import sys, grpc
from kerneld_client.proto import kerneld_pb2 as pb, kerneld_pb2_grpc as g
out = []
for target, call in ((sys.argv[1], "user"), (sys.argv[2], "admin")):
    with grpc.insecure_channel("unix:" + target) as ch:
        try:
            if call == "user":
                g.KernelsStub(ch).GetStatus(pb.GetStatusRequest(), timeout=5)
            else:
                g.AdminStub(ch).ListDenies(pb.ListDeniesRequest(), timeout=5)
            out.append(call + "=OK")
        except grpc.RpcError as exc:
            out.append(call + "=" + exc.code().name)
print(" ".join(out))
"""


def _python_runs_as_nobody() -> bool:
    """The gRPC probe needs this interpreter to be executable by `nobody` (it is not when it
    lives under a private home directory); the raw-connect checks need no interpreter."""
    try:
        subprocess.run([sys.executable, "-c", "pass"], user="nobody", check=True, timeout=30)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


def _probe_as(d: DaemonProcess, user: str, group: str) -> str | None:
    """The outcome of one RPC per socket as `user`:`group`, None if Python cannot run as it."""
    if not _python_runs_as_nobody():
        return None
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(d.user_socket), str(d.admin_socket)],
        user=user,
        group=group,
        extra_groups=[],
        cwd=REPO_ROOT,
        env=clean_env({"PYTHONPATH": f"{REPO_ROOT / 'client'}:{REPO_ROOT}", "HOME": "/"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_root
def test_socket_modes_and_groups_decide_access(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={
            "sockets": {
                "user_mode": "0666",
                "admin_mode": "0660",
                "admin_group": "kerneld-admin",  # the daemon is a member, as in the unit
            }
        },
    )
    st = os.stat(d.admin_socket)
    admin_gid = grp.getgrnam("kerneld-admin").gr_gid
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == admin_gid
    assert stat.S_IMODE(os.stat(d.user_socket).st_mode) == 0o666
    nobody = pwd.getpwnam("nobody").pw_uid
    other_gid = grp.getgrnam("daemon").gr_gid

    # A user outside the admin group: the user socket works, the admin socket refuses.
    assert connect_as(d.user_socket, nobody, other_gid) == 0
    assert connect_as(d.admin_socket, nobody, other_gid) == errno.EACCES
    assert _probe_as(d, "nobody", "daemon") in ("user=OK admin=UNAVAILABLE", None)
    # The same user in the admin group gets both.
    assert connect_as(d.admin_socket, nobody, admin_gid) == 0
    assert _probe_as(d, "nobody", "kerneld-admin") in ("user=OK admin=OK", None)


def _can_read_index(d: DaemonProcess, uid: int, gid: int) -> bool:
    """Whether uid:gid (no supplementary groups) can list the published index."""

    def probe() -> bool:
        try:
            os.listdir(d.store_root / "index")
        except PermissionError:
            return False
        return True

    result: bool = as_user(uid, gid, probe)
    return result


@needs_root
def test_the_store_is_readable_by_exactly_the_user_sockets_users(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    """Issue 16 §3.12: the group that may use the user socket is also the group that may read
    the store, so a user outside it cannot load prefetched kernels from the index either."""
    members = grp.getgrnam("kerneld-users").gr_gid
    outsider = grp.getgrnam("daemon").gr_gid
    nobody = pwd.getpwnam("nobody").pw_uid
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={"sockets": {"user_mode": "0660", "user_group": "kerneld-users"}},
    )
    with d.kernels() as kernels:
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)  # something to read
    st = os.stat(d.store_root)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o750, members)
    assert _can_read_index(d, nobody, members)
    assert not _can_read_index(d, nobody, outsider)
    assert connect_as(d.user_socket, nobody, outsider) == errno.EACCES

    # A socket open to every local user opens the store to them too, on the next start.
    d.stop()
    d.write_config({"sockets": {"user_mode": "0666", "user_group": ""}})
    d.start()
    assert stat.S_IMODE(os.stat(d.store_root).st_mode) == 0o755
    assert _can_read_index(d, nobody, outsider)


def test_metrics_over_a_unix_socket_and_loopback(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    path = daemon_dir("kd-m-") / "metrics.sock"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={"metrics": {"socket": str(path), "listen": f"127.0.0.1:{port}"}},
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    before = http_get_unix(path)
    assert metric(before, "kerneld_ready") == 1
    assert metric(before, "kerneld_store_trees") == 0
    with d.kernels() as kernels, d.admin() as admin:
        # A cold load's first, fetch-less Resolve: the expected answer, not an error (issue 18).
        code, detail = failure(kernels.Resolve, resolve_req(ACT, 1, allow_fetch=False))
        assert detail.code == pb.FETCH_NOT_ALLOWED, (code, detail)
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
        failure(kernels.Resolve, resolve_req(ACT, 2))
        failure(kernels.Resolve, resolve_req("kerneld-test/no-such-kernel", 1))
        admin.GarbageCollect(pb.GcRequest(dry_run=True), timeout=TIMEOUT)
    text = http_get_unix(path)
    assert metric(text, "kerneld_resolves_total", result="not_cached") == 1
    assert metric(text, "kerneld_resolves_total", result="miss") == 1
    assert metric(text, "kerneld_resolves_total", result="hit") == 1
    assert metric(text, "kerneld_resolves_total", result="no_variant") == 1
    assert metric(text, "kerneld_resolves_total", result="not_found") == 1
    # What the docs say to alert on stays quiet on normal operation and missing kernels.
    assert metric(text, "kerneld_resolves_total", result="error") == 0
    assert not [
        ln
        for ln in text.splitlines()
        if ln.startswith("kerneld_fetches_total{") and 'result="error"' in ln
    ], text
    assert metric(text, "kerneld_rpc_errors_total", method="Resolve", code="FETCH_NOT_ALLOWED") == 0
    quiet = f"INFO kerneld.kernels: Resolve failed repo={ACT} selector=v1 code=FETCH_NOT_ALLOWED"
    assert quiet not in d.logs()
    assert f"Resolve failed repo={ACT} selector=v2 code=NO_COMPATIBLE_VARIANT" in d.logs()
    assert (
        metric(text, "kerneld_rpc_errors_total", method="Resolve", code="NO_COMPATIBLE_VARIANT")
        == 1
    )
    assert metric(text, "kerneld_fetches_total", upstream="cli-mirror-0", result="ok") == 1
    assert metric(text, "kerneld_fetch_bytes_total", upstream="cli-mirror-0") > 0
    assert metric(text, "kerneld_leases_granted_total") == 2
    assert metric(text, "kerneld_active_leases") == 2
    assert metric(text, "kerneld_store_trees") == 1
    assert metric(text, "kerneld_store_bytes") > 0
    assert metric(text, "kerneld_gc_runs_total", dry_run="true") == 1
    assert metric(text, "kerneld_stale_serves_total") == 0
    # The same registry on the loopback port.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        over_tcp = reply.read().decode()
    assert metric(over_tcp, "kerneld_resolves_total", result="hit") == 1
    d.stop()
    assert not path.exists()


def test_a_group_socket_without_a_configured_group_keeps_the_store_to_the_daemons_group() -> None:
    """The DaemonSet's socket: 0660, no user_group, so its group is the daemon's own (the pods'
    supplementalGroups); the store root follows it, not world-readable."""
    from kerneld.config import SocketConfig
    from kerneld.server.plumbing.access import store_mode_for

    assert store_mode_for(SocketConfig(path=Path("/run/k.sock"), mode=0o660, group="")) == (
        0o750,
        "",
    )
    assert store_mode_for(SocketConfig(path=Path("/run/k.sock"), mode=0o666, group="")) == (
        0o755,
        "",
    )
    assert store_mode_for(SocketConfig(path=Path("/run/k.sock"), mode=0o600, group="")) is None
