"""No local user can make another user's job fall back, stall or lose a shortcut through the
files the job opens or locks (issue 20 §2): tree lock files, the store's other files and the
daemon's advert, the coalescing locks of cold resolves, and the per-user bytecode cache.

The attacker is a real process running as `nobody` that takes every lock it can on every file
it can reach and keeps them while a victim job (a fresh client interpreter) loads a kernel with
`policy="error"` (a fallback would be an error) and a short deadline.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneld.store.layout import FILE_MODE_LOCK
from kerneld.store.locks import try_lock_exclusive
from kerneld_client import _coalesce
from kerneld_client._types import KernelRequest
from kerneld_client.file_locks import OFD_READ, OFD_WRITE
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, resolve_req
from tests.fixtures_daemon import ACT
from tests.security.support import CPU_FACTS, NOBODY, as_nobody, as_user, needs_root
from tests.support.daemon import DaemonProcess

pytestmark = needs_root

#: Every lock an unprivileged process might take, on a descriptor of each open mode.
LOCKS: dict[str, Callable[[int], object]] = {
    "flock-ex": lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),
    "flock-sh": lambda fd: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB),
    "ofd-write": lambda fd: fcntl.fcntl(fd, fcntl.F_OFD_SETLK, OFD_WRITE),
    "ofd-read": lambda fd: fcntl.fcntl(fd, fcntl.F_OFD_SETLK, OFD_READ),
    "posix-write": lambda fd: fcntl.fcntl(fd, fcntl.F_SETLK, OFD_WRITE),
    "posix-read": lambda fd: fcntl.fcntl(fd, fcntl.F_SETLK, OFD_READ),
    "lease-write": lambda fd: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK),
    "lease-read": lambda fd: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK),
}
#: Locks that, held by another user, would keep a reader out (or stall its open).
EXCLUDING = ("ofd-write", "posix-write", "lease-write", "lease-read")
OPEN_MODES = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}

_kept: list[int] = []  # the attacker's descriptors (in its own forked process)

#: A victim job: load with policy="error" (no fallback) and time it.
LOAD = f"""
import json, time, torch, kerneld_client
t = time.monotonic()
out = {{}}
try:
    out["kid"] = kerneld_client.get_kernel({ACT!r}, version=1, policy="error").__name__
    out["source"] = kerneld_client.loaded_kernels()[0].source
except kerneld_client.KernelError as exc:
    out["error"] = f"{{type(exc).__name__}}: {{exc}}"
out["seconds"] = time.monotonic() - t
print(json.dumps(out))
"""
DEADLINE_S = 10.0


def _lock_everything(paths: list[str]) -> list[str]:
    """Take every lock of LOCKS on every path, each on its own descriptor of every mode that
    opens; keep them; the list of '<lock> <mode> <path>' taken."""
    taken = []
    for path in paths:
        for mode, flags in OPEN_MODES.items():
            for name, take in LOCKS.items():
                try:
                    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
                except OSError:
                    break  # this mode does not open
                try:
                    take(fd)
                except OSError:
                    os.close(fd)
                    continue
                _kept.append(fd)
                taken.append(f"{name} {mode} {path}")
    return taken


@contextlib.contextmanager
def holding_as_nobody(fn: Callable[[], Any]) -> Iterator[Any]:
    """Run `fn` as nobody in a forked child that then keeps its descriptors (and so its locks)
    until the block ends; yields what `fn` returned."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            # An open that breaks a lease it holds sends it SIGIO, whose default action kills.
            signal.signal(signal.SIGIO, signal.SIG_IGN)
            doc: dict[str, Any] = {"ok": fn()}
        except BaseException as exc:
            doc = {"error": repr(exc)}
        os.write(w, (json.dumps(doc) + "\n").encode())
        time.sleep(120)
        os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r) as inp:
            doc = json.loads(inp.readline())
        assert "error" not in doc, doc
        yield doc["ok"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _every_path(*roots: Path) -> list[str]:
    out = []
    for root in roots:
        out.append(str(root))
        for dirpath, dirnames, filenames in os.walk(root):
            out += [os.path.join(dirpath, n) for n in dirnames + filenames]
    return out


@pytest.fixture
def daemon(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, public: Path
) -> DaemonProcess:
    """A daemon whose store and socket directory every user can traverse."""
    socket_dir = public / "run"
    socket_dir.mkdir(mode=0o755)
    return make_daemon(
        mirror_dirs=[kernel_mirror],
        store=public / "store",
        socket_dir=socket_dir,
        config={"sockets": {"user_mode": "0666"}},
    )


def _victim_env(d: DaemonProcess, tmp_path: Path, **extra: str) -> dict[str, str]:
    return client_env(
        d.store_root,
        tmp_path,
        KERNELD_SOCKET=str(d.user_socket),
        KERNELD_PLATFORM_JSON=CPU_FACTS,
        **extra,
    )


def _loads(out: dict[str, Any]) -> None:
    assert out.get("kid") and "error" not in out, out
    assert out["seconds"] < DEADLINE_S, out


def test_no_lock_another_user_can_take_makes_a_job_fall_back(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Tree locks are OFD locks: a job needs the read lock, GC the write lock, which needs a
    writable descriptor only the daemon can open. Whatever `nobody` holds on the lock files,
    the index, the trees, the blobs and the advert, the job loads from the store at once."""
    with daemon.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    lock = str(daemon.store_root / "locks" / f"{Path(hit.path).name}.lock")
    assert stat.S_IMODE(os.stat(lock).st_mode) == FILE_MODE_LOCK == 0o644
    advert = str(daemon.socket_dir / "kerneld.sock.json")
    paths = _every_path(daemon.store_root, daemon.socket_dir)
    assert lock in paths and advert in paths
    env = _victim_env(daemon, tmp_path)
    with holding_as_nobody(lambda: _lock_everything(paths)) as taken:
        # The attack is real: it holds flock LOCK_EX (what made jobs fall back before) and the
        # OFD read lock on the tree's lock file, and locks on the advert...
        assert f"flock-ex r {lock}" in taken and f"ofd-read r {lock}" in taken, taken
        assert f"flock-ex r {advert}" in taken, taken
        # ...but nothing that keeps a reader out, on any path.
        assert [t for t in taken if t.split()[0] in EXCLUDING] == []
        out = run_client(LOAD, env, timeout=60)
        _loads(out)
        assert out["source"] == "index", out  # the warm path: no fallback, no RPC needed
        # What nobody holds keeps the tree alive, exactly as a job using it would.
        probe = try_lock_exclusive(Path(lock))
        assert probe.held
    probe = try_lock_exclusive(Path(lock))
    assert not probe.held
    probe.release()


def test_gc_makes_lock_files_of_older_stores_owner_writable(public: Path) -> None:
    """Lock files made before OFD locks are 0444; the daemon (not root in production) needs a
    writable descriptor for the write lock, so its first probe makes them 0644."""
    import pwd

    kerneld = pwd.getpwnam("kerneld")
    old = public / "old.lock"
    old.write_bytes(b"")
    os.chown(old, kerneld.pw_uid, kerneld.pw_gid)
    old.chmod(0o444)

    assert as_user(kerneld.pw_uid, kerneld.pw_gid, probe_of(old)) is False
    assert stat.S_IMODE(old.stat().st_mode) == 0o644
    # Another user's file is never changed (and refuses the probe).
    theirs = public / "theirs.lock"
    theirs.write_bytes(b"")
    theirs.chmod(0o444)
    with pytest.raises(AssertionError, match="PermissionError"):
        as_user(kerneld.pw_uid, kerneld.pw_gid, probe_of(theirs))
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o444


def probe_of(path: Path) -> Callable[[], bool]:
    def probe() -> bool:
        p = try_lock_exclusive(path)
        p.release()
        return p.held

    return probe


def test_another_user_can_neither_reach_nor_squat_the_coalescing_locks(
    daemon: DaemonProcess, public: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coalescing locks of cold resolves live in the user's own 0700 directory: nobody can
    open them. Nobody can create that directory's name in a shared /tmp first; the job then
    coalesces in its runtime directory instead, and loads."""
    shared_tmp = public / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    import tempfile

    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    req = KernelRequest(ACT, version=1)
    with _coalesce.turn(daemon.user_socket, req, 1.0) as ask:
        assert ask
        own = _coalesce._lock_dir()
        assert own is not None and any(own.iterdir())
        reach = as_nobody(lambda: _lock_everything(_every_path(own.parent)))
        assert reach == []  # not even the directory opens for nobody
    monkeypatch.setattr(tempfile, "tempdir", None)

    # Squat: nobody creates the names a job of uid 0 would use, open to all, and holds the lock.
    squat_tmp = public / "tmp2"
    squat_tmp.mkdir()
    squat_tmp.chmod(0o1777)
    key = _coalesce._key(daemon.user_socket, req)
    squat = squat_tmp / f"kerneld-{os.geteuid()}"

    def squat_and_hold() -> list[str]:
        (squat / "resolving").mkdir(mode=0o777, parents=True)
        squat.chmod(0o777)
        (squat / "resolving").chmod(0o777)
        (squat / "resolving" / f"{key}.lock").write_bytes(b"")
        return _lock_everything([str(squat / "resolving" / f"{key}.lock")])

    env = _victim_env(daemon, tmp_path, TMPDIR=str(squat_tmp))
    runtime = Path(env["XDG_RUNTIME_DIR"])
    runtime.mkdir(mode=0o700)
    with holding_as_nobody(squat_and_hold) as taken:
        assert any(t.startswith("flock-ex") for t in taken), taken
        out = run_client(LOAD, env, timeout=60)
        _loads(out)
        assert out["source"] == "daemon", out  # a cold load, through the coalescing turn
    assert [p.name for p in (runtime / "kerneld" / "resolving").iterdir()] == [f"{key}.lock"]


def test_a_shared_bytecode_cache_cannot_stall_or_feed_a_job(
    daemon: DaemonProcess, public: Path, tmp_path: Path
) -> None:
    """With the bytecode cache in a directory others can write (KERNELD_BYTECODE_CACHE), nobody
    plants FIFOs and lease-held files under the exact names the job will open: the job neither
    waits for them nor uses them (it compiles the source) and loads."""
    with daemon.kernels() as kernels:
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
    private = tmp_path / "private-cache"
    first = run_client(LOAD, _victim_env(daemon, tmp_path, KERNELD_BYTECODE_CACHE=str(private)))
    _loads(first)
    keys = sorted(p.name for p in private.iterdir())
    assert keys, "the job cached nothing: the names to plant are unknown"
    shared = public / "shared-cache"
    shared.mkdir()
    shared.chmod(0o1777)
    env = _victim_env(daemon, tmp_path, KERNELD_BYTECODE_CACHE=str(shared))

    def plant_fifos() -> list[str]:
        for key in keys:
            os.mkfifo(shared / key, 0o666)
        return keys

    with holding_as_nobody(plant_fifos):
        _loads(run_client(LOAD, env, timeout=30))  # a plain open() would wait forever here

    def plant_leases() -> list[str]:
        # A write lease makes every other open() wait for its holder (up to the kernel's
        # lease-break-time, 45 s).
        taken = []
        for key in keys:
            (shared / key).unlink()
            (shared / key).write_bytes(b"\0" * 64)
            fd = os.open(shared / key, os.O_RDONLY)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
            _kept.append(fd)
            taken.append(key)
        return taken

    with holding_as_nobody(plant_leases) as leased:
        assert leased == keys
        _loads(run_client(LOAD, env, timeout=30))
    assert all((shared / k).stat().st_uid == NOBODY.pw_uid for k in keys)  # none replaced


def test_the_flock_structs_are_what_the_kernel_expects() -> None:
    """`file_locks` builds `struct flock` without the struct module (warm path); it must equal the
    C layout for a whole-file lock with `l_pid == 0` (OFD locks refuse anything else)."""
    import struct

    for kind, packed in ((fcntl.F_RDLCK, OFD_READ), (fcntl.F_WRLCK, OFD_WRITE)):
        assert packed == struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 0, 0)
