"""Who is on the other end of a Hub API connection, and may they use it?

The endpoint must not widen what the user socket allows. The user socket's file mode and group
are its access control, enforced by the kernel at `connect(2)`; a TCP port has none. So each
connection is attributed to a uid and checked against the user socket's *current* owner, group
and mode, as the kernel would check a connect to it:

- a unix socket connection: SO_PEERCRED gives the uid, gid and (SO_PEERGROUPS) the groups;
- a loopback TCP connection: the kernel's socket table (`/proc/net/tcp`, `tcp6`) lists the
  client's end of the connection with its owner's uid; its groups come from the user database
  (the process's own supplementary groups are not visible over TCP).

A connection whose uid cannot be found (another network namespace's socket table, a race with
a closing client) is refused, not admitted.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
import socket
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kerneld.server.identity import Caller

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _table_endpoint(text: str) -> tuple[str, int]:
    """`0100007F:1F90` (the kernel's 32-bit words of the address, in host order) as
    ('127.0.0.1', 8080); a v4-mapped v6 address reads as its v4 form."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _normal(str(ipaddress.ip_address(packed))), int(port, 16)


def _normal(host: str) -> str:
    """One spelling of an address: `::ffff:127.0.0.1` (a v4 client of a dual-stack socket)
    reads as 127.0.0.1."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def tcp_peer_uid(
    client: tuple[str, int], server: tuple[str, int], tables: Iterable[Path] = _TCP_TABLES
) -> int | None:
    """The uid owning the client's end of a loopback TCP connection, or None if not listed.

    The client's socket is the row whose local address is the client's and whose remote
    address is ours (our accepted socket is the mirror image: its uid is the daemon's)."""
    want = (_normal(client[0]), client[1])
    ours = (_normal(server[0]), server[1])
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8:
                continue
            try:
                if _table_endpoint(fields[1]) == want and _table_endpoint(fields[2]) == ours:
                    return int(fields[7])
            except ValueError:
                continue
    return None


def unix_peer(sock: socket.socket) -> Caller:
    """The kernel's credentials of a unix socket peer (uid -1 if it gives none)."""
    try:
        pid, uid, gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
    except OSError:
        return Caller()
    groups: frozenset[int] = frozenset({gid})
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * 256)
        groups |= frozenset(struct.unpack(f"{len(raw) // 4}I", raw))
    except OSError:
        pass
    return Caller(uid=uid, gid=gid, pid=pid, groups=groups)


def user_db_caller(uid: int) -> Caller:
    """A uid with its primary and supplementary groups from the user database."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return Caller(uid=uid, gid=-1, groups=frozenset())
    try:
        groups = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = frozenset({entry.pw_gid})
    return Caller(uid=uid, gid=entry.pw_gid, groups=groups)


@dataclass(frozen=True)
class Admission:
    """The verdict for one connection, with the reason a refusal shows."""

    allowed: bool
    reason: str = ""


def admit(caller: Caller, user_socket: Path) -> Admission:
    """May `caller` use the user socket, by its owner, group and mode right now (the check
    `connect(2)` makes: write permission on the socket file)?"""
    if not caller.known:
        return Admission(False, "the connection's owner could not be found")
    if caller.uid in (0, os.geteuid()):
        return Admission(True)
    try:
        st = os.stat(user_socket)
    except OSError as exc:
        return Admission(False, f"the user socket {user_socket} is not there ({exc.strerror})")
    mode = stat.S_IMODE(st.st_mode)
    if caller.uid == st.st_uid:
        ok = bool(mode & stat.S_IWUSR)
    elif st.st_gid == caller.gid or st.st_gid in caller.groups:
        ok = bool(mode & stat.S_IWGRP)
    else:
        ok = bool(mode & stat.S_IWOTH)
    if ok:
        return Admission(True)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return Admission(
        False,
        f"uid {caller.uid} may not use kerneld's user socket {user_socket} (mode "
        f"{mode:04o}, group {group}): ask an admin to add you to group {group}",
    )
