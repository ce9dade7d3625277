"""Nobody outside the admin group reaches any Admin RPC (every RPC from the proto descriptor).

The two-socket split is the authorisation model: the user socket serves only the Kernels
service (read-only RPCs), the admin socket serves Admin and is group-restricted by its file
mode. A gRPC server cannot learn its caller's uid, so these tests call every RPC as real other
users over the real sockets of a real daemon.
"""

from __future__ import annotations

import grp
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kerneld.server.fronts.rpc.admin_service import AdminService
from kerneld.server.fronts.rpc.kernels_service import KernelsService
from tests.security.probe_rpc import methods, probe
from tests.security.support import NOBODY, needs_root
from tests.support.daemon import REPO_ROOT, DaemonProcess, clean_env

ADMIN = methods("Admin")
KERNELS = methods("Kernels")
#: Status codes that mean "the call never reached the Admin service".
NOT_REACHED = {"UNAVAILABLE", "UNIMPLEMENTED"}


def _probe_as(uid: int, gid: int, socket: Path, service: str, *groups: int) -> dict[str, str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.security.probe_rpc",
            str(uid),
            str(gid),
            str(socket),
            service,
            *map(str, groups),
        ],
        cwd=REPO_ROOT,
        env=clean_env({"PYTHONPATH": f"{REPO_ROOT / 'client'}:{REPO_ROOT}"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def test_every_admin_rpc_is_implemented_and_only_on_the_admin_service() -> None:
    """The enumeration is the descriptor's: each Admin RPC has a servicer method, and none of
    them exists on the Kernels service (a mutation added to Kernels would be reachable by
    every user of the host)."""
    assert {"Deny", "Pin", "GarbageCollect", "MirrorImport", "ReloadConfig"} <= set(ADMIN)
    for name in ADMIN:
        assert name in vars(AdminService), f"Admin.{name} has no implementation"
    mutating = {"Prefetch", "Pin", "Unpin", "Deny", "Allow", "GarbageCollect", "MirrorImport"}
    assert not mutating & set(KERNELS)
    assert not mutating & set(vars(KernelsService))


def test_the_user_socket_serves_no_admin_rpc(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror])
    over_user = probe(str(d.user_socket), "Admin")
    assert set(over_user) == set(ADMIN)
    assert set(over_user.values()) == {"UNIMPLEMENTED"}, over_user
    # Control: the same probe reaches the Admin service on the admin socket...
    over_admin = probe(str(d.admin_socket), "Admin")
    assert not set(over_admin.values()) & NOT_REACHED, over_admin
    # ...and the Kernels service on the user socket.
    assert probe(str(d.user_socket), "Kernels")["GetStatus"] == "OK"


@needs_root
def test_no_admin_rpc_for_a_user_outside_the_admin_group(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    """As `nobody` (not in the admin group), every Admin RPC fails before it reaches the
    service; the same process loads kernels over the user socket; a member of the admin group
    reaches every Admin RPC."""
    admin_group = grp.getgrnam("kerneld-admin").gr_gid  # the daemon is a member, as deployed
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={
            "sockets": {"user_mode": "0666", "admin_mode": "0660", "admin_group": "kerneld-admin"}
        },
    )
    before = len(d.logs())
    outsider = _probe_as(NOBODY.pw_uid, NOBODY.pw_gid, d.admin_socket, "Admin")
    assert set(outsider) == set(ADMIN)
    assert set(outsider.values()) == {"UNAVAILABLE"}, outsider
    assert _probe_as(NOBODY.pw_uid, NOBODY.pw_gid, d.user_socket, "Kernels")["GetStatus"] == "OK"
    # Nothing the outsider tried reached the daemon: no admin line, no reload.
    tried = d.logs()[before:]
    assert "admin:" not in tried and "config reloaded" not in tried, tried
    member = _probe_as(NOBODY.pw_uid, NOBODY.pw_gid, d.admin_socket, "Admin", admin_group)
    assert not set(member.values()) & NOT_REACHED, member
    assert "config reloaded" in d.logs()[before:]  # the member's ReloadConfig did reach it
