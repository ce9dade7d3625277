"""Binding the daemon's unix sockets safely.

grpcio unlinks whatever is at a unix socket path before binding, so a second server would
silently take over a live socket (REFERENCE §7). Before binding, the daemon therefore
1. takes an exclusive `flock` on `<socket>.lock` (mode 0600, held for its lifetime; a second
   daemon with the same socket path, whatever its store, fails here and names the holder's pid;
   other users cannot open the file, so they cannot hold the lock to keep the daemon out);
2. refuses a path where something still accepts connections (a server that does not use the lock);
3. removes a stale socket file left by a crash.
The socket is created under a restrictive umask (never briefly more open than configured), then
chmod'ed to the configured mode and chown'ed to the configured group: the mode is the access
control, since the server cannot learn a caller's uid.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from kerneld.config import SocketConfig
from kerneld.errors import ErrorKind
from kerneld_client.file_locks import PidLock, PidLockHeld
from kerneld_client.locations import Advert, advert_path

log = logging.getLogger("kerneld.sockets")

#: sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class SocketBusy(Exception):
    """Another live server owns the socket path."""

    kind = ErrorKind.INTERNAL


class SocketSetupError(Exception):
    """The socket cannot be created as configured (bad group, path too long, not a socket)."""

    kind = ErrorKind.INTERNAL


class SocketLock:
    """The exclusive lock that makes one daemon the owner of a socket path (a `PidLock` on
    `<socket>.lock`)."""

    def __init__(self, sock: Path) -> None:
        self.path = sock.with_name(sock.name + ".lock")
        sock.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            self._lock = PidLock(self.path)
        except PidLockHeld as exc:
            raise SocketBusy(
                f"another kerneld (pid {exc.pid or 'unknown'}) is serving {sock}; stop it first, "
                "or give this one another --socket/--admin-socket"
            ) from None

    def release(self) -> None:
        self._lock.release()


def is_live(path: Path) -> bool:
    """True when something accepts connections on the unix socket at `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        # Somebody's socket we cannot even probe (EACCES/EPERM): do not take it.
        return exc.errno in (errno.EACCES, errno.EPERM)
    finally:
        probe.close()
    return True


def prepare_path(path: Path) -> None:
    """Make `path` bindable: refuse a live server or a non-socket, remove a stale socket."""
    if not path.is_absolute():
        raise SocketSetupError(f"socket path {path} must be absolute")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketSetupError(
            f"socket path {path} is {len(os.fsencode(path))} bytes; unix sockets allow at most "
            f"{MAX_SOCKET_PATH}"
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketSetupError(f"{path} exists and is not a socket; refusing to replace it")
    if is_live(path):
        raise SocketBusy(f"{path} is in use by a live server; refusing to take it over")
    log.info("removing stale socket %s", path)
    path.unlink()


def group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise SocketSetupError(f"group {name!r} does not exist") from None


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Set the process umask for the block (binding happens before any other thread writes)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def secure(path: Path, cfg: SocketConfig) -> None:
    """chmod/chown a freshly bound socket to its configured mode and group."""
    if cfg.group:
        gid = group_id(cfg.group)
        if os.stat(path).st_gid != gid:
            try:
                os.chown(path, -1, gid)
            except PermissionError:
                raise SocketSetupError(
                    f"cannot give socket {path} to group {cfg.group!r}: the daemon (uid "
                    f"{os.geteuid()}) is not a member of it; add it (SupplementaryGroups= in the "
                    "unit, or usermod -aG) or configure a group it is in"
                ) from None
    os.chmod(path, cfg.mode)
    st = os.stat(path)
    log.info(
        "socket %s mode %04o uid %d gid %d", path, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    )


def write_advert(advert: Advert) -> Path:
    """Publish the advert beside the user socket (atomic rename, world-readable).

    The temporary file gets an unguessable name and is created with O_EXCL|O_NOFOLLOW: in a
    shared directory another user could otherwise plant a symlink or a file of theirs there and
    have the daemon write through it, or keep their own file as the advert.
    """
    target = advert_path(advert.user_socket)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    try:
        try:
            os.write(fd, advert.to_json().encode() + b"\n")
            os.fchmod(fd, 0o644)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def remove_advert(user_socket: Path, pid: int) -> None:
    """Remove our advert (never another daemon's)."""
    from kerneld_client.errors import UntrustedPath
    from kerneld_client.locations import read_advert

    try:
        advert = read_advert(user_socket)
    except UntrustedPath:  # not ours to remove
        return
    if advert is not None and advert.pid == pid:
        advert_path(user_socket).unlink(missing_ok=True)
