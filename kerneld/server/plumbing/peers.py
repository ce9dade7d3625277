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

The check runs when the connection is accepted, before a byte of it is read (`identify_peer`,
called by `kerneld/server/fronts/httpfront/httpd.py`). A TCP answer counts only for the exact
4-tuple, in the established state, with a socket inode: a client that sent its request and closed at
once has left an orphan or time-wait socket, which the kernel reports as uid 0 without an inode (and
a client that half-closed is no longer established). A connection whose uid cannot be found that
way (another network namespace's socket table, a client gone) is refused, not admitted.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
import socket
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneld.server.plumbing.identity import Caller, peer_credentials

_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def tcp_peer_uid(
    client: tuple[str, int], server: tuple[str, int], tables: Iterable[Path] = _TCP_TABLES
) -> int | None:
    """The uid owning the client's end of a loopback TCP connection, or None if not found.

    Only a live socket names a uid: the kernel's answer must be for exactly this connection
    (both addresses and ports), in the established state, and carry a socket inode. A client
    that has already closed leaves an orphan (FIN-WAIT, TIME-WAIT) that the kernel reports
    with uid 0 and no inode: that is refused, never read as root.

    Asked of the kernel by the connection's addresses (sock_diag: ~15 µs); where netlink is not
    allowed, read from the socket tables (a walk of the whole TCP hash table: ~6 ms per table on
    a quiet host, more on a busy one)."""
    answer = _sock_diag(client, server)
    if answer is not None:
        return answer.uid if answer.live else None
    return _table_uid(client, server, tables)


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one exact lookup by the 4-tuple.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSGHDR = struct.Struct("=LHHLL")  # length, type, flags, seq, pid
_INET_DIAG_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF
#: inet_diag_msg: family, state, timer, retrans; the socket id (sport, dport: network order;
#: src, dst: 16 bytes each; interface, cookie); expires, rqueue, wqueue, uid, inode.
_INET_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
TCP_ESTABLISHED = 1
_SEQ = 0x6B64  # "kd"


class _DiagSocket:
    """One netlink sock_diag socket kept for the daemon's lifetime (a connect flood costs a
    request and an answer each, not a socket each); asked under a lock, each question with its
    own sequence number so that a late answer to an earlier one is never read as this one's.
    One descriptor (`kerneld.server.app.descriptor_budget`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._seq = _SEQ

    def ask(self, request: bytes) -> bytes:
        """The kernel's answer to `request` (its header's seq is replaced); OSError if none."""
        with self._lock:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            seq = self._seq
            message = request[:8] + struct.pack("=L", seq) + request[12:]
            try:
                if self._sock is None:
                    kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    self._sock = socket.socket(socket.AF_NETLINK, kind, _NETLINK_SOCK_DIAG)
                    self._sock.settimeout(1.0)
                self._sock.sendto(message, (0, 0))
                while True:
                    answer = self._sock.recv(8192)
                    if len(answer) >= _NLMSGHDR.size and _NLMSGHDR.unpack_from(answer)[3] == seq:
                        return answer
            except OSError:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                raise


_DIAG = _DiagSocket()


@dataclass(frozen=True)
class DiagAnswer:
    """The kernel's sock_diag answer for one TCP socket."""

    state: int
    uid: int
    inode: int

    @property
    def live(self) -> bool:
        """An open socket of a running process: established, with an inode."""
        return self.state == TCP_ESTABLISHED and self.inode != 0


def _sock_diag(client: tuple[str, int], server: tuple[str, int]) -> DiagAnswer | None:
    """The diagnostic answer for the client's end of the connection; None where netlink is
    not available (the tables are asked then); a `DiagAnswer` that is not `live` when the
    kernel knows no such open socket."""
    gone = DiagAnswer(0, -1, 0)
    try:
        src, dst = ipaddress.ip_address(client[0]), ipaddress.ip_address(server[0])
        if src.version != dst.version:
            return gone
        family = socket.AF_INET if src.version == 4 else socket.AF_INET6
        sport, dport = struct.pack("!H", client[1]), struct.pack("!H", server[1])
        src_b, dst_b = src.packed.ljust(16, b"\0"), dst.packed.ljust(16, b"\0")
        sock_id = (
            sport
            + dport
            + src_b
            + dst_b
            + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
        )
        body = _INET_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sock_id
        head = _NLMSGHDR.pack(
            _NLMSGHDR.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, _SEQ, 0
        )
        answer = _DIAG.ask(head + body)
    except (OSError, ValueError):
        return None  # no netlink here (a sandbox without AF_NETLINK): the tables will do
    if len(answer) < _NLMSGHDR.size:
        return gone
    length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(answer)
    if kind != _SOCK_DIAG_BY_FAMILY:
        return gone  # NLMSG_ERROR: ENOENT, no such socket
    if length < _NLMSGHDR.size + _INET_DIAG_MSG.size or len(answer) < length:
        return gone
    (fam, state, _t, _r, a_sport, a_dport, a_src, a_dst, _if, _cookie, _exp, _rq, _wq, uid,
     inode) = _INET_DIAG_MSG.unpack_from(answer, _NLMSGHDR.size)  # fmt: skip
    if (fam, a_sport, a_dport, a_src, a_dst) != (family, sport, dport, src_b, dst_b):
        return gone  # not the socket asked about
    return DiagAnswer(state, uid, inode)


def _sock_diag_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid of the client's end by sock_diag alone (None: no live socket, or no netlink)."""
    answer = _sock_diag(client, server)
    return answer.uid if answer is not None and answer.live else None


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
            if len(fields) < 10:
                continue
            try:
                if _table_endpoint(fields[1]) == want and _table_endpoint(fields[2]) == ours:
                    live = int(fields[3], 16) == TCP_ESTABLISHED and int(fields[9]) != 0
                    return int(fields[7]) if live else None
            except ValueError:
                continue
    return None


def identify_peer(sock: socket.socket, peer: Any) -> Caller | None:
    """Who is on the other end of a just-accepted connection (`HttpFront`'s `identify`):
    SO_PEERCRED on a unix socket, the live client socket's owner on loopback TCP with its
    groups from the user database; None when the kernel names no one."""
    if isinstance(peer, tuple):
        uid = tcp_peer_uid(peer[:2], sock.getsockname()[:2])
        return None if uid is None else user_db_caller(uid)
    caller = unix_peer(sock)
    return caller if caller.known else None


def unix_peer(sock: socket.socket) -> Caller:
    """The kernel's credentials of a unix socket peer (uid -1 if it gives none)."""
    try:
        pid, uid, gid, groups = peer_credentials(sock)
    except OSError:
        return Caller()
    return Caller(uid=uid, gid=gid, pid=pid, groups=frozenset(groups) | {gid})


#: How long a uid's groups from the user database are reused: a connect flood from one uid
#: asks the database (NSS: files, maybe LDAP) once, and a change of membership counts within it
#: (at once where it is a change of /etc/group or /etc/passwd: `_user_db_stamp`).
USER_DB_TTL_S = 2.0
_USER_DB_FILES = (Path("/etc/group"), Path("/etc/passwd"))
_USER_DB: OrderedDict[int, tuple[float, tuple[int, ...], Caller]] = OrderedDict()
_USER_DB_LOCK = threading.Lock()


def _user_db_stamp() -> tuple[int, ...]:
    """The local user database's files' change times (a stat each: far cheaper than a lookup)."""
    out = []
    for path in _USER_DB_FILES:
        try:
            out.append(path.stat().st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)


def user_db_caller(uid: int) -> Caller:
    """A uid with its primary and supplementary groups from the user database (kept for
    `USER_DB_TTL_S` while /etc/group and /etc/passwd do not change, at most 1024 uids)."""
    now = time.monotonic()
    stamp = _user_db_stamp()
    with _USER_DB_LOCK:
        cached = _USER_DB.get(uid)
    if cached is not None and now - cached[0] < USER_DB_TTL_S and cached[1] == stamp:
        return cached[2]
    caller = _user_db_lookup(uid)
    with _USER_DB_LOCK:
        _USER_DB[uid] = (now, stamp, caller)
        _USER_DB.move_to_end(uid)
        while len(_USER_DB) > 1024:
            _USER_DB.popitem(last=False)
    return caller


def _user_db_lookup(uid: int) -> Caller:
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
