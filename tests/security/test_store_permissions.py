"""A local user who is not the store owner can read the store but change nothing in it, cannot
keep the daemon from (re)starting, and cannot take over or replace its sockets.

Every path of a real store (filled by a real daemon: trees, blobs, locks, the published index, the
SQLite index) is attacked from a process running as `nobody`: create, write, truncate, chmod,
rename, unlink, link. The probe itself is shown to detect a writable directory, so a store that
let anything through would fail the test.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneld_client.file_locks import OFD_READ, ofd_lock
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT, resolve_req
from tests.fixtures_daemon import ACT, DEP_TOP
from tests.security.support import as_nobody, needs_root
from tests.support.daemon import DaemonProcess

pytestmark = needs_root

REFUSED = {errno.EACCES, errno.EPERM, errno.EROFS}


def _attempt(wins: list[str], what: str, fn: Callable[..., object], *args: object) -> None:
    """Try one operation; record it in `wins` if it succeeded (or failed unexpectedly)."""
    try:
        fn(*args)
    except OSError as exc:
        if exc.errno not in REFUSED and exc.errno != errno.ENOENT:
            wins.append(f"{what}: unexpected {exc!r}")
        return
    wins.append(what)


def _open(path: str, flags: int) -> None:
    os.close(os.open(path, flags))


def _bind(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)


def _bind_in(folder: str) -> None:
    """Bind a unix socket in `folder` (by a relative name: tree paths are too long for
    sockaddr_un); only ever called in a throw-away child process."""
    os.chdir(folder)
    _bind(f".probe-{os.getpid()}.sock")


def _attack(paths: list[tuple[str, bool]]) -> list[str]:
    """Every write-like operation on every path; the ones that succeeded (run as nobody)."""
    wins: list[str] = []
    for path, is_dir in paths:
        if is_dir:
            probe = os.path.join(path, f".probe-{os.getpid()}")
            _attempt(wins, f"create in {path}", _open, probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            _attempt(wins, f"mkdir in {path}", os.mkdir, probe)
            _attempt(wins, f"bind a socket in {path}", _bind_in, path)
        else:
            _attempt(wins, f"open for write {path}", _open, path, os.O_WRONLY)
            _attempt(wins, f"truncate {path}", os.truncate, path, 0)
            _attempt(wins, f"link {path}", os.link, path, path + ".x")
        _attempt(wins, f"chmod {path}", os.chmod, path, 0o777)
        _attempt(wins, f"utime {path}", os.utime, path, (0, 0))
        _attempt(wins, f"rename {path}", os.rename, path, path + ".moved")
        _attempt(wins, f"remove {path}", os.rmdir if is_dir else os.unlink, path)
    return wins


def _every_path(root: Path) -> list[tuple[str, bool]]:
    out = [(str(root), True)]
    for dirpath, dirnames, filenames in os.walk(root):
        out += [(os.path.join(dirpath, d), True) for d in dirnames]
        out += [(os.path.join(dirpath, f), False) for f in filenames]
    return out


@pytest.fixture
def filled(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, public: Path
) -> DaemonProcess:
    """A daemon whose store (in a directory everyone can traverse) holds trees, blobs, locks,
    index documents and a deny."""
    socket_dir = public / "run"
    socket_dir.mkdir(mode=0o755)
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        store=public / "store",
        socket_dir=socket_dir,
        config={"sockets": {"user_mode": "0666"}},
    )
    with d.kernels() as kernels, d.admin() as admin:
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
        kernels.Resolve(resolve_req(DEP_TOP, 1), timeout=TIMEOUT)
        admin.Deny(pb.DenyRequest(repo_id="kerneld-test/other", reason="x"), timeout=TIMEOUT)
    return d


def test_a_non_owner_cannot_change_anything_in_the_store(filled: DaemonProcess) -> None:
    paths = _every_path(filled.store_root)
    kinds = {Path(p).name for p, _ in paths}
    assert {"index.sqlite3", "owner.lock", "denies.json", "trees", "blobs", "locks"} <= kinds
    trees = [p for p, is_dir in paths if is_dir and Path(p).parent.name == "trees"]
    assert len(trees) == 3  # act (CPU) + top + bottom
    before = {p: os.lstat(p) for p, _ in paths}

    wins = as_nobody(lambda: _attack(paths))
    assert wins == [], "a non-owner changed the store:\n" + "\n".join(wins)
    after = {p: os.lstat(p) for p, _ in _every_path(filled.store_root)}
    assert set(after) == set(before)
    for path, a in after.items():
        b = before[path]
        assert (a.st_mode, a.st_uid, a.st_gid) == (b.st_mode, b.st_uid, b.st_gid), path
        if "/v1/trees/" in path or "/v1/blobs/" in path or "/locks/" in path:
            # (the daemon itself may write its SQLite index meanwhile: leases are written behind)
            assert (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)

    # What clients need still works as nobody: read a tree, share-lock it, read the index.
    tree = Path(trees[0])
    lock = filled.store_root / "locks" / f"{tree.name}.lock"

    def client_like() -> list[str]:
        fd = os.open(lock, os.O_RDONLY)
        ofd_lock(fd, OFD_READ, blocking=False)
        os.close(fd)
        denies = (filled.store_root / "index" / "v1" / "denies.json").read_text()
        return [*sorted(os.listdir(tree)), denies[:1]]

    assert "metadata.json" in as_nobody(client_like)
    # ...while the private parts stay private.
    assert stat.S_IMODE(os.stat(filled.store_root / "v1" / "index.sqlite3").st_mode) == 0o600


def test_the_probe_detects_a_writable_directory(public: Path) -> None:
    """The attack above is not vacuous: a directory nobody may write is reported."""
    open_dir = public / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "file").write_text("x")
    (open_dir / "file").chmod(0o666)
    wins = as_nobody(lambda: _attack(_every_path(open_dir)))
    assert any(w.startswith("create in") for w in wins)
    assert any(w.startswith("open for write") for w in wins)


def test_a_non_owner_cannot_block_or_hijack_the_daemon(filled: DaemonProcess) -> None:
    """The files that decide who owns the store and the sockets are private (`flock` needs no
    write access, so a readable lock file could be held by anyone to keep the daemon out), the
    socket directory is the daemon's, and a restart goes through."""
    run = filled.socket_dir
    private = [
        filled.store_root / "owner.lock",
        run / "kerneld.sock.lock",
        run / "admin.sock.lock",
    ]
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in private)

    def hold_or_replace() -> list[str]:
        wins: list[str] = []
        for path in private:
            _attempt(wins, f"open {path}", _open, str(path), os.O_RDONLY)
        for sock in (filled.user_socket, filled.admin_socket):
            _attempt(wins, f"unlink {sock}", os.unlink, sock)
            _attempt(wins, f"bind {sock}.new", _bind, f"{sock}.new")
        return wins

    assert as_nobody(hold_or_replace) == []
    filled.stop(signal.SIGTERM)
    assert as_nobody(hold_or_replace) == []  # not while it is down either
    filled.start()
    with filled.kernels() as kernels:
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.path
