"""Who is on the other end of a Hub API connection, and may they use it?

The endpoint must not widen what the user socket allows. The user socket's file mode and group
are its access control, enforced by the kernel at `connect(2)`; a TCP port has none. So each
connection is attributed to a uid and checked against the user socket's *current* owner, group
and mode, as the kernel would check a connect to it:

- a unix socket connection: SO_PEERCRED gives the uid, gid and (SO_PEERGROUPS) the groups;
- a loopback TCP connection: the kernel knows the owner of the client's end of the connection
  (asked over sock_diag netlink by the connection's addresses; `/proc/net/tcp` where netlink is
  not allowed); its groups come from the user database (the process's own supplementary groups
  are not visible over TCP).

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

from kerneld.server.identity import Caller, peer_credentials

_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def tcp_peer_uid(
    client: tuple[str, int], server: tuple[str, int], tables: Iterable[Path] = _TCP_TABLES
) -> int | None:
    """The uid owning the client's end of a loopback TCP connection, or None if not found.

    Asked of the kernel by the connection's addresses (sock_diag: ~15 µs); where netlink is not
    allowed, read from the socket tables (a walk of the whole TCP hash table: ~6 ms per table on
    a quiet host, more on a busy one)."""
    uid = _sock_diag_uid(client, server)
    if uid is not None:
        return uid
    return _table_uid(client, server, tables)


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one exact lookup by the 4-tuple.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSGHDR = struct.Struct("=LHHLL")  # length, type, flags, seq, pid
_INET_DIAG_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF
#: In the answer (inet_diag_msg): family..retrans (4), the socket id (48), expires, rqueue,
#: wqueue (12), then the uid.
_UID_OFFSET = _NLMSGHDR.size + 4 + 48 + 12


def _sock_diag_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    try:
        src, dst = ipaddress.ip_address(client[0]), ipaddress.ip_address(server[0])
        family = socket.AF_INET if src.version == 4 else socket.AF_INET6
        sock_id = (
            struct.pack("!HH", client[1], server[1])
            + src.packed.ljust(16, b"\0")
            + dst.packed.ljust(16, b"\0")
            + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
        )
        body = _INET_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sock_id
        head = _NLMSGHDR.pack(
            _NLMSGHDR.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
        )
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(head + body, (0, 0))
            answer = nl.recv(8192)
    except (OSError, ValueError):
        return None  # no netlink here (a sandbox without AF_NETLINK): the tables will do
    if len(answer) < _UID_OFFSET + 4:
        return None
    if _NLMSGHDR.unpack_from(answer)[1] == _NLMSG_ERROR:
        return None
    uid: int = struct.unpack_from("=I", answer, _UID_OFFSET)[0]
    return uid


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


def _table_uid(
    client: tuple[str, int], server: tuple[str, int], tables: Iterable[Path]
) -> int | None:
    """The client's socket is the row whose local address is the client's and whose remote
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
        pid, uid, gid, groups = peer_credentials(sock)
    except OSError:
        return Caller()
    return Caller(uid=uid, gid=gid, pid=pid, groups=frozenset(groups) | {gid})


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
