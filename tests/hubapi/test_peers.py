"""Who a Hub API connection belongs to (the kernel's answer, two ways), and the user socket's
rule applied to that uid."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from kerneld.server.plumbing.identity import Caller
from kerneld.server.plumbing.peers import (
    _sock_diag,
    _sock_diag_uid,
    _table_uid,
    admit,
    tcp_peer_uid,
)

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_kernel_names_the_owner_of_the_clients_end(host: str) -> None:
    """A client of another uid (nobody, when the tests run as root) connects; sock_diag and the
    socket tables both name it, and nothing is named for a connection that does not exist."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        server = socket.socket(family)
        server.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    server.listen()
    want = 65534 if os.geteuid() == 0 else os.geteuid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: connect as `want`, hold the connection until told
        try:
            os.close(w)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            conn = socket.create_connection(server.getsockname()[:2])
            os.read(r, 1)
            conn.close()
        finally:
            os._exit(0)
    os.close(r)
    try:
        accepted, client = server.accept()
        ours = accepted.getsockname()[:2]
        assert _sock_diag_uid(client[:2], ours) == want
        assert _table_uid(client[:2], ours, TABLES) == want
        assert tcp_peer_uid(client[:2], ours) == want
        gone = (client[0], 1)  # no such connection
        assert _sock_diag_uid(gone, ours) is None
        assert _table_uid(gone, ours, TABLES) is None
        accepted.close()
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)
        server.close()


def test_admission_follows_the_user_sockets_owner_group_and_mode(tmp_path: Path) -> None:
    sock_path = tmp_path / "kerneld.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        st = os.stat(sock_path)
        other_uid = st.st_uid + 1000
        member = Caller(uid=other_uid, gid=12345, groups=frozenset({st.st_gid}))
        outsider = Caller(uid=other_uid, gid=12345, groups=frozenset({12345}))
        os.chmod(sock_path, 0o660)
        assert admit(member, sock_path).allowed
        refused = admit(outsider, sock_path)
        assert not refused.allowed and f"uid {other_uid} may not use" in refused.reason
        assert "0660" in refused.reason
        os.chmod(sock_path, 0o666)
        assert admit(outsider, sock_path).allowed
        os.chmod(sock_path, 0o600)
        assert not admit(member, sock_path).allowed
        assert admit(Caller(uid=os.geteuid(), gid=0), sock_path).allowed  # the daemon itself
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    assert not admit(Caller(), sock_path).allowed  # an unknown owner is refused
    assert not admit(member, tmp_path / "gone.sock").allowed


def test_a_client_that_closed_is_named_by_no_one_not_root() -> None:
    """The client sends and closes before the server looks: the kernel still answers for its
    end (an orphan or time-wait socket) but with uid 0 and no inode, which must not be read as
    root: both lookups name no one."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")
    accepted, address = server.accept()
    ours = accepted.getsockname()[:2]
    assert tcp_peer_uid(address[:2], ours) == os.geteuid()  # while it is open
    client.close()
    try:
        answer = _sock_diag(address[:2], ours)
        assert answer is not None and not answer.live
        assert answer.inode == 0 or answer.state != 1, answer
        assert tcp_peer_uid(address[:2], ours) is None
        assert _table_uid(address[:2], ours, TABLES) is None
    finally:
        accepted.close()
        server.close()
