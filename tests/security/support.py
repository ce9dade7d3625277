"""Helpers of the security tests: run code as another user, public directories, small and
failing file systems.

Switching users needs root (CI runs as root); tests that need it are marked `needs_root` and
skip with the reason otherwise. The test interpreter usually lives where `nobody` cannot read it
(under /root), so code "as nobody" is never a fresh interpreter: `as_user` forks this process
and drops privileges in the child (pure `os` calls, no gRPC), and the gRPC probe in
test_admin_socket imports everything as root and drops privileges before its first connect.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

#: Client processes get their platform from here instead of importing torch (seconds each).
CPU_FACTS = '{"torch_version": "2.13", "cxx11_abi": true, "backend": "cpu"}'

NOBODY = pwd.getpwnam("nobody")

#: A victim job (`% {"repo": ...}`): what it imported, or the error it got, as JSON; then what
#: the default policy (fallback to PyTorch) gives it.
VICTIM = """
import json, torch, kerneld_client
out = {}
try:
    out["kid"] = kerneld_client.get_kernel(%(repo)r, version=1, policy="error").KID
except kerneld_client.KernelError as exc:
    out["error"] = type(exc).__name__
    out["message"] = str(exc)
out["default"] = str(kerneld_client.get_kernel(%(repo)r, version=1, fallback="torch"))
print(json.dumps(out))
"""


def as_user(uid: int, gid: int, fn: Callable[[], Any], *, timeout: float = 60.0) -> Any:
    """Run `fn` in a forked child as uid/gid (no supplementary groups); its JSON-able result.

    The child reports through a pipe; an exception in it is re-raised here as AssertionError.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            doc: dict[str, Any] = {"ok": fn()}
        except BaseException as exc:
            doc = {"error": repr(exc)}
        with os.fdopen(w, "w") as out:
            out.write(json.dumps(doc))
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as inp:
        text = inp.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"child exited with {status}"
    doc = json.loads(text)
    if "error" in doc:
        raise AssertionError(f"as uid {uid}: {doc['error']}")
    return doc["ok"]


def as_nobody(fn: Callable[[], Any]) -> Any:
    return as_user(NOBODY.pw_uid, NOBODY.pw_gid, fn)


@contextmanager
def public_dir(prefix: str = "kd-sec-") -> Iterator[Path]:
    """A directory every user may traverse (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


MOUNT_TIMEOUT_S = 30.0
"""mount, mkfs and umount are bounded: a kernel that wedges one fails the test, not the run."""


def _system(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a mount tool; a timeout is a failure (returncode -1), never a hang."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, -1, "", f"timed out: {exc}")


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)]
    return _system(cmd).returncode == 0


def mount_ext4(where: Path, image: Path, size: int) -> str | None:
    """Loop-mount a fresh ext4 of `size` bytes with errors=remount-ro; its device name."""
    where.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    if _system(["mkfs.ext4", "-q", str(image)]).returncode != 0:
        return None
    if _system(["mount", "-o", "loop,errors=remount-ro", str(image), str(where)]).returncode != 0:
        return None
    where.chmod(0o755)
    found = _system(["findmnt", "-no", "SOURCE", str(where)]).stdout.strip()
    return os.path.basename(found) or None


def ext4_error(device: str) -> None:
    """Make ext4 report an error on `device`: with errors=remount-ro the kernel remounts it
    read-only at once, open writers or not, exactly as after a real disk error."""
    Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("kerneld security test\n")


def umount(where: Path) -> None:
    _system(["umount", "-l", str(where)])


def fill(path: Path) -> int:
    """Write zeros to `path` until the file system is full; the bytes written (never more than
    its size, so a file system that keeps freeing space cannot keep this writing)."""
    st = os.statvfs(path.parent)
    limit = st.f_blocks * st.f_frsize
    written = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (65536, 512):
            try:
                while written < limit:
                    n = f.write(b"\0" * chunk)
                    if not n:
                        break
                    written += n
            except OSError:
                pass
    return written


@contextmanager
def group_member(user: str, group: str) -> Iterator[None]:
    """`user` in `group` in the user database while any test of any xdist worker needs it: the
    membership is machine-wide, so a count under a file lock (not each test's own add and
    remove) decides when it is added and taken away again."""
    import fcntl

    lock = Path(tempfile.gettempdir()) / f"kerneld-tests-member-{user}-{group}.lock"

    def change(delta: int) -> None:
        with open(lock, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            count = int(f.read().strip() or 0)
            if delta > 0 and count == 0:
                subprocess.run(["gpasswd", "-a", user, group], check=True, capture_output=True)
            if delta < 0 and count == 1:
                subprocess.run(["gpasswd", "-d", user, group], check=True, capture_output=True)
            f.seek(0)
            f.truncate()
            f.write(str(max(0, count + delta)))

    change(+1)
    try:
        yield
    finally:
        change(-1)


@contextmanager
def nobody_kept_out(*, admit: bool = False) -> Iterator[None]:
    """The attack tests use `nobody` as the outsider (in no kerneld group); the one test that
    admits `nobody` to a group for a moment (`admit=True`) waits until no such test runs, and
    they wait for it (a shared / exclusive file lock across xdist workers)."""
    import fcntl

    lock = Path(tempfile.gettempdir()) / "kerneld-tests-nobody-outsider.lock"
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX if admit else fcntl.LOCK_SH)
        yield


#: The HTTP attack tests' member: an ordinary login account, in `MEMBERS_GROUP` only while a test
#: needs it (the `member` fixture).
TESTER_NAME = "kerneld-tester"
MEMBERS_GROUP = "kerneld-users"
