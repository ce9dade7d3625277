"""Issue 52, findings 5 and 6: the Hub endpoint's connection slots and workers are shared
fairly among members, a request's body is read before it takes a worker, and an outsider's
connect flood is refused cheaply. The daemon runs as `kerneld` in the unit's cgroup limits
(`confine.py`); the attackers are real local users.

Over the endpoint's unix socket (0660 `kerneld-users`) a member is any uid whose group is
`kerneld-users` (the kernel's credentials of the peer): the two attackers are uids with no
other rights (`ATTACKERS`), the third member is `kerneld-tester`. `nobody` is the outsider.
"""

from __future__ import annotations

import contextlib
import grp
import http.client
import pwd
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_hub import REPO, VARIANT
from tests.hubapi.support import endpoint_of
from tests.security.confine import UnitLimits, confine, unit_limits
from tests.security.support import MEMBERS_GROUP, NOBODY, TESTER_NAME, as_user, needs_root
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer

pytestmark = needs_root
TESTER = pwd.getpwnam(TESTER_NAME)
GROUP = MEMBERS_GROUP
#: Two members' uids (no account needed: over the unix socket the kernel names the peer).
ATTACKERS = (61001, 61002)
INFO = f"/api/kernels/{REPO}/revision/v1"
FILE = f"/kernels/{REPO}/resolve/v1/build/{VARIANT}/metadata.json"
PATHS_INFO = f"/api/kernels/{REPO}/paths-info/v1"
#: How long the attackers hold what they took (the member asks meanwhile).
HOLD_S = 4.0


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        super().__init__("kerneld", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.unix_path))


def unix_get(path: Path, target: str, timeout: float = 10.0) -> Any:
    """The status of one GET over the unix socket, or the error's repr."""
    conn = UnixHTTPConnection(path, timeout)
    try:
        conn.request("GET", target)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError as exc:
        return repr(exc)
    finally:
        conn.close()


@pytest.fixture
def endpoint(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, member: pwd.struct_passwd
) -> Iterator[tuple[DaemonProcess, Path, tuple[str, int], UnitLimits]]:
    """The confined daemon, warm for REPO, with its endpoint on a unix socket and loopback:
    (daemon, socket path, TCP address, limits)."""
    where = daemon_dir("kd-share-")
    sock = where / "hub-api.sock"
    config = {
        "sockets": {"user_mode": "0660", "user_group": GROUP},
        "hub_api": {"listen": "127.0.0.1:0", "socket": str(sock)},
        "fetch": {"allow_groups": [GROUP]},
    }
    with unit_limits() as limits:
        daemon = make_daemon(start=False, hub_endpoint=hub_server.url, config=config)
        daemon.spawn()
        confine(daemon, limits)
        daemon.wait_ready()
        host, port = endpoint_of(daemon).removeprefix("http://").rsplit(":", 1)
        gid = grp.getgrnam(GROUP).gr_gid
        warm = as_user(TESTER.pw_uid, gid, lambda: [unix_get(sock, INFO), unix_get(sock, FILE)])
        assert warm == [200, 200], warm
        try:
            yield daemon, sock, (host, int(port)), limits
        finally:
            daemon.close()


def attack_in_background(
    fn: Callable[[], Any], uids: tuple[int, ...], gid: int
) -> tuple[list[threading.Thread], dict[int, Any]]:
    """Run `fn` as each uid (gid `gid`) at once, in forked children; their results by uid."""
    results: dict[int, Any] = {}

    def run(uid: int) -> None:
        try:
            results[uid] = as_user(uid, gid, fn, timeout=90)
        except BaseException as exc:
            results[uid] = repr(exc)

    threads = [threading.Thread(target=run, args=(u,), daemon=True) for u in uids]
    for t in threads:
        t.start()
    return threads, results


def test_two_members_cannot_take_every_connection_slot(
    endpoint: tuple[DaemonProcess, Path, tuple[str, int], UnitLimits],
) -> None:
    """Finding 5: two members each open 400 connections (more than the whole endpoint's
    512) and hold them; a third member's loads are still answered."""
    daemon, sock, _, limits = endpoint
    gid = grp.getgrnam(GROUP).gr_gid

    def hold() -> int:
        """Take every slot it can and keep trying: a refused connection (a 503, or closed) is
        replaced at once, for the whole attack; how many it held midway."""
        conns: list[socket.socket] = []
        held = 0
        start = time.monotonic()
        while time.monotonic() - start < HOLD_S:
            for s in [s for s in conns if not _held(s)]:
                conns.remove(s)
                s.close()
            if not held and time.monotonic() - start > 1.5:
                held = len(conns)
            for _ in range(400 - len(conns)):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(str(sock))
                except OSError:
                    s.close()
                    continue
                conns.append(s)
            time.sleep(0.05)
        for s in conns:
            s.close()
        return held

    threads, results = attack_in_background(hold, ATTACKERS, gid)
    time.sleep(2.0)  # both attackers hold what they could (within the 5 s head deadline)
    statuses = as_user(
        TESTER.pw_uid, gid, lambda: [unix_get(sock, INFO), unix_get(sock, FILE)], timeout=60
    )
    for t in threads:
        t.join(90)
    held = [results.get(u) for u in ATTACKERS]
    assert all(isinstance(h, int) for h in held), held
    assert sum(held) >= 256, held  # they did take most of the slots
    assert statuses == [200, 200], (statuses, held)
    assert daemon.running() and limits.oom_kills() == 0


def _held(s: socket.socket) -> bool:
    """Open with nothing to read: a slot the daemon holds for its owner (a refused one has
    its 503 to read, or is closed)."""
    s.setblocking(False)
    try:
        s.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def test_a_head_announcing_a_body_never_sent_holds_no_worker(
    endpoint: tuple[DaemonProcess, Path, tuple[str, int], UnitLimits],
) -> None:
    """Finding 5: two members send 40 paths-info heads each announcing a body (60,000 bytes:
    within what the endpoint takes) and never send it; a third member's loads are answered
    meanwhile, and a head announcing more than the endpoint takes is refused at once (413),
    as is a chunked body (411)."""
    daemon, sock, _, limits = endpoint
    gid = grp.getgrnam(GROUP).gr_gid
    head = (
        f"POST {PATHS_INFO} HTTP/1.1\r\nHost: kerneld\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 60000\r\n\r\n"
    ).encode()

    def stall() -> int:
        conns = []
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with contextlib.suppress(OSError):
                s.connect(str(sock))
                s.sendall(head)
                conns.append(s)
        time.sleep(HOLD_S)
        for s in conns:
            s.close()
        return len(conns)

    threads, results = attack_in_background(stall, ATTACKERS, gid)
    time.sleep(1.5)
    statuses = as_user(
        TESTER.pw_uid,
        gid,
        lambda: [unix_get(sock, INFO, timeout=20), unix_get(sock, FILE, timeout=20)],
        timeout=60,
    )
    for t in threads:
        t.join(90)
    assert [results.get(u) for u in ATTACKERS] == [40, 40], results
    assert statuses == [200, 200], statuses

    def oversized(extra: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock))
            s.sendall(f"POST {PATHS_INFO} HTTP/1.1\r\nHost: kerneld\r\n{extra}\r\n".encode())
            return s.recv(4096).decode("latin-1")

    big = as_user(TESTER.pw_uid, gid, lambda: oversized("Content-Length: 1048576\r\n"))
    assert big.startswith("HTTP/1.1 413") and "at most 65536" in big, big
    chunked = as_user(TESTER.pw_uid, gid, lambda: oversized("Transfer-Encoding: chunked\r\n"))
    assert chunked.startswith("HTTP/1.1 411") and "Content-Length" in chunked, chunked
    assert daemon.running() and limits.oom_kills() == 0


def test_an_outsider_connect_flood_is_refused_cheaply_and_members_are_served(
    endpoint: tuple[DaemonProcess, Path, tuple[str, int], UnitLimits],
) -> None:
    """Finding 6: an outsider connecting over and over gets its 403 (why it is refused) at
    most 32 times a second; the rest of its connections are closed unanswered, and a member's
    loads over TCP meanwhile are answered."""
    daemon, _, address, limits = endpoint
    total = 400

    def flood() -> list[float]:
        answered = 0
        start = time.monotonic()
        for _ in range(total):
            try:
                with socket.create_connection(address, timeout=5) as s:
                    answered += s.recv(64).startswith(b"HTTP/1.1 403")
            except OSError:
                pass  # reset: closed unanswered
        return [answered, time.monotonic() - start]

    done: dict[str, Any] = {}
    attacker = threading.Thread(
        target=lambda: done.update(r=as_user(NOBODY.pw_uid, NOBODY.pw_gid, flood, timeout=90)),
        daemon=True,
    )
    attacker.start()

    def loads() -> list[Any]:
        out = []
        for _ in range(15):
            time.sleep(0.05)
            conn = http.client.HTTPConnection(*address, timeout=20)
            try:
                conn.request("GET", INFO)
                out.append(conn.getresponse().status)
            except OSError as exc:
                out.append(repr(exc))
            finally:
                conn.close()
        return out

    statuses = as_user(TESTER.pw_uid, TESTER.pw_gid, loads, timeout=90)
    attacker.join(90)
    answered, seconds = done["r"]
    assert answered >= 1, done  # the outsider is told why
    # a burst of 32, then 32 a second: the rest were closed without an answer
    assert answered < total and answered <= 32 + 32 * seconds + 8, done
    assert statuses and all(s == 200 for s in statuses), statuses
    assert daemon.running() and limits.oom_kills() == 0
