"""Caller tokens under the unit's `ProtectProc=invisible` (issue 42 §4): the daemon cannot see
other users' /proc/<pid>, so a token cannot be bound by the process's start time. It is bound
by a pidfd (SO_PEERPIDFD) where the kernel has one, and not issued at all where it has
neither: a token replayed after its process exited is never accepted.

The daemon runs as `kerneld` in a mount namespace whose /proc has `hidepid=invisible`; the
victim and the attacker are real processes of other users."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.fixtures_daemon import ACT
from tests.security.confine import HiddenProcDaemon
from tests.security.support import NOBODY, needs_root
from tests.security.test_caller_identity import OPEN, TESTER, audit_lines, resolve, run_as
from tests.support.daemon import REPO_ROOT, DaemonProcess, account, clean_env, default_user

pytestmark = needs_root


def test_a_token_replayed_after_its_process_exited_is_refused_under_hidepid(
    tmp_path: Path, kernel_mirror: Path, make_daemon: Callable[..., DaemonProcess]
) -> None:
    daemon = HiddenProcDaemon(tmp_path / "d", mirror_dirs=[kernel_mirror], config=OPEN)
    with daemon:
        mounts = Path(f"/proc/{daemon.pid}/mountinfo").read_text()
        assert "hidepid=invisible" in mounts or "hidepid=2" in mounts, mounts
        sock = daemon.user_socket
        (victim_token,) = run_as(TESTER, sock, [{"op": "token"}])  # the process exits
        assert victim_token and f".{TESTER.pw_uid}." in victim_token
        got = run_as(NOBODY, sock, [resolve(ACT, token=victim_token), resolve(ACT)])
        assert got[0].startswith("UNAUTHENTICATED") and "exited" in got[0], got
        assert got[1] == "OK", got  # the attacker's own calls: its own rights
        assert not any(f"uid={TESTER.pw_uid}" in line for line in audit_lines(daemon))
        # a live process's own token is bound by a pidfd (the kernel has SO_PEERPIDFD) and
        # accepted for that process
        own, result = run_as(TESTER, sock, [{"op": "token"}, resolve(ACT)])
        assert own.split(".")[4].startswith("p") and result == "OK", (own, result)


def test_no_token_is_issued_when_the_process_cannot_be_told_apart() -> None:
    """Without SO_PEERPIDFD, a peer hidden by hidepid has no readable start time: the book
    issues nothing (the client then calls anonymously) instead of an unbound token."""
    user = default_user() or "kerneld"
    pw = account(user)
    code = (
        "from kerneld.server.plumbing.identity import TokenBook, _start_time\n"
        "import os\n"
        "book = TokenBook()\n"
        "assert _start_time(os.getpid()) > 0\n"
        "print(book.issue(0, 0, 1, ()), book.issue(0, 0, os.getpid(), ()) is not None)\n"
    )
    mount = 'mount -t proc -o hidepid=invisible proc /proc && exec "$@"'
    cmd = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", mount, "sh"]
    cmd += ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
    cmd += ["--", sys.executable, "-c", code]
    out = subprocess.run(
        cmd, cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "True"], out.stdout
    assert os.geteuid() == 0
