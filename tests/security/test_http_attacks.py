"""Issue 42: the HTTP listeners attacked by local users, with the daemon confined as the unit
confines it (`kerneld` user, a cgroup with MemoryMax=1G and TasksMax=512: `confine.py`).

The endpoint's user socket is 0660 `kerneld-users`; `nobody` is the outsider (in no kerneld
group), `kerneld-tester` the member (added to `kerneld-users` in the user database for the
test: a TCP peer's groups come from there). Each attack runs for a bounded time while a member
loads a kernel through the endpoint (its info and one file, a fresh connection each) and every
load must finish within its bound (`load_bound_s`: a multiple of the same load at rest, measured
on the same daemon in the same run, so a busy machine moves both); the daemon must never be
killed. The token replay
after a process exited is `test_token_hidepid.py`.
"""

from __future__ import annotations

import contextlib
import http.client
import pwd
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.daemon.rpc import http_get_unix, metric
from tests.fixtures_hub import REPO, VARIANT
from tests.hubapi.support import endpoint_of
from tests.security.confine import UnitLimits, confine, unit_limits
from tests.security.support import MEMBERS_GROUP, NOBODY, TESTER_NAME, as_user, needs_root
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer

pytestmark = needs_root
TESTER = pwd.getpwnam(TESTER_NAME)
GROUP = MEMBERS_GROUP
#: A member's load (info + a file over two fresh connections) during an attack may take this
#: many times its slowest load at rest, measured before the attack (issue 55: a bound the
#: machine's load moves with the baseline, not absolute seconds) ...
LOAD_SLOWDOWN = 30
#: ... and never less than this: well past what a load takes at rest on a quiet machine
#: (~10 ms) and well under the client timeouts that made loads fail.
LOAD_FLOOR_S = 3.0
REST_LOADS = 5
#: The per-uid connection cap docs/hub-api.md states (a black-box test: no daemon import).
PER_UID = 256
INFO = f"/api/kernels/{REPO}/revision/v1"
FILE = f"/kernels/{REPO}/resolve/v1/build/{VARIANT}/metadata.json"


@pytest.fixture
def confined(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, member: pwd.struct_passwd
) -> Iterator[tuple[DaemonProcess, tuple[str, int], UnitLimits]]:
    """The daemon with its endpoint on loopback, in the unit's cgroup limits, warm for REPO."""
    metrics = daemon_dir("kd-m-") / "metrics.sock"
    config = {
        "sockets": {"user_mode": "0660", "user_group": GROUP},
        "hub_api": {"listen": "127.0.0.1:0"},
        "fetch": {"allow_groups": [GROUP]},
        "metrics": {"socket": str(metrics)},
    }
    with unit_limits() as limits:
        daemon = make_daemon(start=False, hub_endpoint=hub_server.url, config=config)
        daemon.spawn()
        confine(daemon, limits)
        daemon.wait_ready()
        host, port = endpoint_of(daemon).removeprefix("http://").rsplit(":", 1)
        address = (host, int(port))
        daemon.metrics_socket = metrics  # type: ignore[attr-defined]
        assert as_user(member.pw_uid, member.pw_gid, lambda: load(address))[0] == 200
        daemon.load_bound_s = load_bound_s(address, member)  # type: ignore[attr-defined]
        try:
            yield daemon, address, limits
        finally:
            daemon.close()


def get(address: tuple[str, int], path: str) -> int:
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def load(address: tuple[str, int]) -> list[Any]:
    """[info status, file status, seconds] of one member load."""
    start = time.monotonic()
    try:
        statuses: list[Any] = [get(address, INFO), get(address, FILE)]
    except OSError as exc:
        statuses = [repr(exc), None]
    return [*statuses, time.monotonic() - start]


def load_bound_s(address: tuple[str, int], member: pwd.struct_passwd) -> float:
    """How long a member's load may take during an attack: LOAD_SLOWDOWN times its slowest of
    REST_LOADS at rest, now, on this daemon (at least LOAD_FLOOR_S)."""
    rest = as_user(member.pw_uid, member.pw_gid, lambda: [load(address) for _ in range(REST_LOADS)])
    assert all(r[:2] == [200, 200] for r in rest), rest
    return max(LOAD_FLOOR_S, LOAD_SLOWDOWN * max(r[2] for r in rest))


def member_loads_during(
    address: tuple[str, int], attack: Callable[[], Any], seconds: float
) -> tuple[list[list[Any]], Any]:
    """Run `attack` (as its user) in the background while the member loads, every 0.25 s."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["attack"] = attack()
        except BaseException as exc:
            result["attack"] = repr(exc)

    attacker = threading.Thread(target=run, daemon=True)
    attacker.start()
    time.sleep(0.5)  # the attack is under way

    def loads() -> list[list[Any]]:
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            out.append(load(address))
            time.sleep(0.25)
        return out

    got = as_user(TESTER.pw_uid, TESTER.pw_gid, loads, timeout=seconds + 60)
    attacker.join(seconds + 60)
    return got, result.get("attack")


def check_loads(loads: list[list[Any]], daemon: DaemonProcess, limits: UnitLimits) -> None:
    assert daemon.running(), f"the daemon was killed: {daemon.logs()[-2000:]}"
    assert limits.oom_kills() == 0
    assert loads and all(s[:2] == [200, 200] for s in loads), loads
    slowest, bound = max(s[2] for s in loads), daemon.load_bound_s  # type: ignore[attr-defined]
    assert slowest < bound, f"a member's load took {slowest:.2f} s (bound {bound:.2f} s): {loads}"


def served_info(daemon: DaemonProcess) -> float:
    text = http_get_unix(daemon.metrics_socket)  # type: ignore[attr-defined]
    return metric(text, "kerneld_hub_api_requests_total", route="info", status="200")


def bare_cr_request(lines: int, width: int) -> bytes:
    pad = b"".join(b"X-Pad-%d: " % i + b"\r" * width + b"\r\n" for i in range(lines))
    return f"GET {INFO} HTTP/1.1\r\nHost: kerneld\r\n".encode() + pad + b"\r\n"


def test_an_outsider_that_closes_at_once_is_not_served_as_root(
    confined: tuple[DaemonProcess, tuple[str, int], UnitLimits],
) -> None:
    """The orphaned-socket race: a request with a few 65,000-byte bare-CR header lines, the
    client closed at once. Its end is then a time-wait socket that the kernel reports as uid 0
    without an inode; the request must not be served (as root, or at all)."""
    daemon, address, _ = confined
    before = served_info(daemon)
    request = bare_cr_request(3, 65000)

    def hit_and_run() -> int:
        sent = 0
        for _ in range(20):
            with socket.create_connection(address, timeout=5) as s:
                try:
                    s.sendall(request)
                    sent += 1
                except OSError:
                    pass
        return sent

    as_user(NOBODY.pw_uid, NOBODY.pw_gid, hit_and_run)
    time.sleep(3)  # what was read would be answered by now
    assert served_info(daemon) == before, "an outsider's request was served"
    assert "audit" not in daemon.logs() or f"uid={NOBODY.pw_uid}" not in daemon.logs()
    assert get(address, INFO) == 200  # root, still connected: served as itself


def test_oversized_headers_neither_kill_the_daemon_nor_stall_members(
    confined: tuple[DaemonProcess, tuple[str, int], UnitLimits],
) -> None:
    """12 concurrent requests of 98 bare-CR header lines of 64,000 bytes (6.3 MB each) from an
    outsider, and 6 more from a member, sent again and again for 15 s."""
    daemon, address, limits = confined
    request = bare_cr_request(98, 64000)  # with Host: 99 headers, under the old cap of 100

    def flood(seconds: float, clients: int) -> Callable[[], int]:
        def run() -> int:
            deadline = time.monotonic() + seconds
            count = [0]

            def one() -> None:
                while time.monotonic() < deadline:
                    try:
                        with socket.create_connection(address, timeout=5) as s:
                            s.sendall(request)
                            s.recv(1024)
                    except OSError:
                        pass
                    count[0] += 1

            threads = [threading.Thread(target=one) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return count[0]

        return run

    outsider = threading.Thread(
        target=lambda: as_user(NOBODY.pw_uid, NOBODY.pw_gid, flood(15, 12), timeout=90),
        daemon=True,
    )
    outsider.start()
    loads, sent = member_loads_during(
        address, lambda: as_user(TESTER.pw_uid, TESTER.pw_gid, flood(15, 6), timeout=90), 14
    )
    outsider.join(90)
    assert isinstance(sent, int) and sent > 6, sent  # the attack ran
    check_loads(loads, daemon, limits)
    peak = limits.peak_bytes()
    assert peak < 512 << 20, f"the daemon's cgroup peaked at {peak >> 20} MiB"


def test_an_outsider_holding_300_connections_does_not_block_members(
    confined: tuple[DaemonProcess, tuple[str, int], UnitLimits],
) -> None:
    """Slot exhaustion: 300 connections opened and kept alive with a header byte every 2 s."""
    daemon, address, limits = confined

    def hold(seconds: float) -> int:
        conns = []
        for _ in range(300):
            with contextlib.suppress(OSError):
                conns.append(socket.create_connection(address, timeout=5))
        deadline = time.monotonic() + seconds
        for s in conns:
            with contextlib.suppress(OSError):
                s.sendall(b"GET / HTTP/1.1\r\n")
        while time.monotonic() < deadline:
            time.sleep(2)
            for s in conns:
                with contextlib.suppress(OSError):
                    s.sendall(b"X")
        for s in conns:
            s.close()
        return len(conns)

    loads, held = member_loads_during(
        address, lambda: as_user(NOBODY.pw_uid, NOBODY.pw_gid, lambda: hold(12), timeout=90), 10
    )
    assert held == 300, held  # the kernel took all 300 (the daemon then closed them)
    check_loads(loads, daemon, limits)
    assert limits.tasks() < 128, f"{limits.tasks()} tasks in the daemon's cgroup"


def test_a_member_is_capped_per_uid_and_others_keep_loading(
    confined: tuple[DaemonProcess, tuple[str, int], UnitLimits],
) -> None:
    """A member opening 60 idle connections more than its per-uid share holds only the share
    (the rest get a 503 saying why); the others (here root's loads) are not held up, and the
    daemon's tasks stay well under TasksMax."""
    daemon, address, limits = confined
    held: dict[str, Any] = {}

    def hold() -> list[int]:
        conns = [socket.create_connection(address, timeout=5) for _ in range(PER_UID + 60)]
        # Read each answer as it comes (a loaded machine may take a while to send 60), up to a
        # deadline; the connections within the share never get one.
        refused = 0
        with selectors.DefaultSelector() as waiting:
            for s in conns:
                waiting.register(s, selectors.EVENT_READ)
            deadline = time.monotonic() + 20
            while refused < 60 and waiting.get_map() and time.monotonic() < deadline:
                for key, _ in waiting.select(timeout=0.2):
                    waiting.unregister(key.fileobj)
                    with contextlib.suppress(OSError):
                        if key.fileobj.recv(64).startswith(b"HTTP/1.1 503"):  # type: ignore[union-attr]
                            refused += 1
        time.sleep(3)
        for s in conns:
            s.close()
        return [len(conns), refused]

    attacker = threading.Thread(
        target=lambda: held.update(r=as_user(TESTER.pw_uid, TESTER.pw_gid, hold)), daemon=True
    )
    attacker.start()
    time.sleep(1.5)
    times = []
    for _ in range(8):
        start = time.monotonic()
        assert get(address, INFO) == 200
        times.append(time.monotonic() - start)
    attacker.join(60)
    assert held["r"][1] >= 60, held  # those past the per-uid cap were refused, with why
    assert max(times) < daemon.load_bound_s, (times, daemon.load_bound_s)  # type: ignore[attr-defined]
    assert daemon.running() and limits.oom_kills() == 0
