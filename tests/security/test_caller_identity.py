"""Issue 20 §3: the daemon knows who calls it (server/plumbing/identity.py), whatever the request
says.

Every caller here is a real process of a real user (`nobody`, `kerneld-tester`, root) talking
to a real daemon over its unix sockets; the daemon learns uids from the kernel (SO_PEERCRED on
the `.cred` side-channel), never from the request.
"""

from __future__ import annotations

import grp
import json
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fixtures_daemon import ACT, DEP_TOP, MULTI
from tests.security.support import NOBODY, needs_root
from tests.support.daemon import REPO_ROOT, DaemonProcess, clean_env

pytestmark = needs_root
TESTER = pwd.getpwnam("kerneld-tester")
USERS_GID = grp.getgrnam("kerneld-users").gr_gid
OPEN = {"sockets": {"user_mode": "0666"}}


def run_as(
    user: pwd.struct_passwd | None, socket: Path, steps: list[dict[str, Any]], *groups: int
) -> list[Any]:
    """The steps' results, done by a fresh process of `user` (None: root)."""
    uid, gid = (0, 0) if user is None else (user.pw_uid, user.pw_gid)
    result = subprocess.run(
        [sys.executable, "-m", "tests.security.caller", str(uid), str(gid), str(socket)]
        + [json.dumps(steps)]
        + [str(g) for g in groups],
        cwd=REPO_ROOT,
        env=clean_env({"PYTHONPATH": f"{REPO_ROOT / 'client'}:{REPO_ROOT}"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out: list[Any] = json.loads(result.stdout)
    return out


def resolve(repo: str, **kw: Any) -> dict[str, Any]:
    return {"op": "resolve", "repo": repo, **kw}


def audit_lines(daemon: DaemonProcess) -> list[str]:
    return [line for line in daemon.logs().splitlines() if "audit caller=" in line]


def test_audit_names_the_real_uid_when_client_lies(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    daemon = make_daemon(mirror_dirs=[kernel_mirror], config=OPEN)
    got = run_as(NOBODY, daemon.user_socket, [resolve(ACT, client="pid=1 user=root")])
    assert got == ["OK"]
    line = next(x for x in audit_lines(daemon) if f"repo={ACT}" in x)
    assert f"uid={NOBODY.pw_uid}(nobody)" in line and "rpc=Resolve" in line, line
    assert "fetch allowed" in line and "pid=" in line
    # the same kernel again is served from the store: no fetch, no audit line
    assert run_as(NOBODY, daemon.user_socket, [resolve(ACT)]) == ["OK"]
    assert len([x for x in audit_lines(daemon) if f"repo={ACT}" in x]) == 1
    # an admin mutation names the admin's uid (and its outcome)
    assert run_as(None, daemon.admin_socket, [{"op": "pin", "repo": ACT}]) == ["OK"]
    pin = [x for x in audit_lines(daemon) if "rpc=Admin/Pin" in x]
    assert len(pin) == 1 and "uid=0(root)" in pin[0] and "result=ok" in pin[0], pin


def test_allow_groups_refuses_outsiders_fetch_but_serves_cached(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    config = {**OPEN, "fetch": {"allow_groups": ["kerneld-users"], "attempts": 2}}
    daemon = make_daemon(mirror_dirs=[kernel_mirror], config=config)
    assert run_as(None, daemon.user_socket, [resolve(ACT)]) == ["OK"]  # root: cached now
    outsider = run_as(NOBODY, daemon.user_socket, [resolve(MULTI), resolve(ACT)])
    assert outsider[0].startswith("PERMISSION_DENIED") and "allow_groups" in outsider[0]
    assert outsider[1] == "OK", outsider  # what is cached still loads
    anonymous = run_as(NOBODY, daemon.user_socket, [resolve(MULTI, token="none")])
    assert anonymous[0].startswith("PERMISSION_DENIED"), anonymous
    member = run_as(NOBODY, daemon.user_socket, [resolve(MULTI)], USERS_GID)
    assert member == ["OK"]
    refused = [x for x in audit_lines(daemon) if "fetch refused" in x]
    assert any(f"uid={NOBODY.pw_uid}(nobody)" in x for x in refused), refused


def test_one_uids_burst_is_limited_while_another_uid_fetches(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    config = {**OPEN, "fetch": {"per_uid_rate": 1, "per_uid_burst": 2, "attempts": 2}}
    daemon = make_daemon(mirror_dirs=[kernel_mirror], config=config)
    got = run_as(NOBODY, daemon.user_socket, [resolve(ACT), resolve(MULTI), resolve(DEP_TOP)])
    assert got[:2] == ["OK", "OK"], got
    assert got[2].startswith("RESOURCE_EXHAUSTED") and "per_uid_rate" in got[2], got
    assert f"uid {NOBODY.pw_uid}" in got[2]
    # another user is not held up by it; nobody's cached kernels still load
    assert run_as(TESTER, daemon.user_socket, [resolve(DEP_TOP)]) == ["OK"]
    assert run_as(NOBODY, daemon.user_socket, [resolve(ACT), resolve(DEP_TOP)]) == ["OK", "OK"]


def test_forged_or_replayed_tokens_are_refused(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    daemon = make_daemon(mirror_dirs=[kernel_mirror], config=OPEN)
    sock = daemon.user_socket
    # the victim's token, leaked; its process has exited since
    (victim_token,) = run_as(TESTER, sock, [{"op": "token"}])
    assert victim_token and f".{TESTER.pw_uid}." in victim_token
    # the attacker's own token, rewritten to name the victim's uid
    (own,) = run_as(NOBODY, sock, [{"op": "token"}])
    fields = own.split(".")
    fields[1] = str(TESTER.pw_uid)
    forged = ".".join(fields)
    got = run_as(
        NOBODY,
        sock,
        [
            resolve(ACT, token=victim_token),
            resolve(ACT, token=forged),
            resolve(ACT, token="garbage"),
            resolve(ACT, token="none"),
            resolve(ACT),
        ],
    )
    assert got[0].startswith("UNAUTHENTICATED") and "exited" in got[0], got
    assert got[1].startswith("UNAUTHENTICATED") and "not issued" in got[1], got
    assert got[2].startswith("UNAUTHENTICATED"), got
    assert got[3:] == ["OK", "OK"], got  # no token: anonymous, with the socket's rights
    assert not any(f"uid={TESTER.pw_uid}" in x for x in audit_lines(daemon))


def test_the_ranks_of_one_job_share_one_charge_per_kernel() -> None:
    """64 ranks of one uid that miss the same kernel together join one download: they spend one
    token of that uid's bucket, not 64; a different kernel, or the same one a minute later
    (a loop), is charged again."""
    from kerneld.server.plumbing.identity import Caller, FetchGate
    from kerneld.server.statuses import RateLimited

    now = [1000.0]
    gate = FetchGate(clock=lambda: now[0])
    job = Caller(uid=NOBODY.pw_uid, gid=NOBODY.pw_gid, pid=4242)
    for _ in range(64):
        gate.take(job, per_minute=60, burst=2, what="org/act@v1/")
    gate.take(job, per_minute=60, burst=2, what="org/other@v1/")
    try:
        gate.take(job, per_minute=60, burst=2, what="org/third@v1/")
    except RateLimited as exc:
        assert "per_uid_burst" in str(exc)
    else:
        raise AssertionError("a third distinct kernel within the burst of 2 was not limited")
    now[0] += FetchGate.REPEAT_FREE_S + 1.0  # a minute on: the bucket refilled, repeats charge
    gate.take(job, per_minute=60, burst=2, what="org/act@v1/")
    gate.take(job, per_minute=60, burst=2, what="org/act@v1/")  # free again
