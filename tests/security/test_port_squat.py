"""Port squatting: a local user who takes a listener's port before (or while) kerneld is not on it.

Jobs with `HF_ENDPOINT=http://127.0.0.1:PORT` import whatever the server on that port names as a
kernel. Whoever can bind the port when it is free can stand in for kerneld; and a daemon that
refused to start when an optional port was taken could be kept down by anyone. Checked here:

- a system daemon serves the Hub endpoint on no port an unprivileged user could bind, whether it
  would bind it itself or systemd passed it (the passed one is held and answered with a 503 that
  says why), and serves everything else;
- a user daemon serves it with a warning saying what a squatter could do;
- a port another user holds (the endpoint's, the metrics') stops nothing: the daemon starts,
  serves jobs over its sockets and says in `kerneldctl status` which listener is missing;
- under a real systemd (tests/systemd/container.py) with the shipped units, an unprivileged user
  trying to bind the endpoint's port in a loop never gets it: across `systemctl restart
  kerneld`, a crash (SIGKILL, `Restart=on-failure`) and `systemctl stop`/`start` of
  kerneld.socket and kerneld (the port-change recipe of docs/operations.md); and the metrics
  port that user does take during a restart does not keep the daemon down.

The daemon runs as the `kerneld` user, the squatter as `kerneld-tester` (an ordinary account
scripts/bootstrap creates); both are real processes of real users.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kerneld.server.plumbing.exposure import check_hub_endpoint, unprivileged_port_start
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import resolve_req
from tests.daemon.test_socket_activation import ActivatedDaemon, ask
from tests.security.support import needs_root
from tests.support.daemon import REPO_ROOT, DaemonProcess, clean_env

SQUATTER_USER = "kerneld-tester"
SYSTEMD = REPO_ROOT / "systemd"

#: Binds `argv[1]` loopback ports (0: any free one) and holds them until stdin closes.
HOLD = r"""
import socket, sys
held = []
for port in sys.argv[1:]:
    s = socket.socket()
    s.bind(("127.0.0.1", int(port)))
    s.listen(8)
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held), flush=True)
sys.stdin.read()
"""


def squatter_account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SQUATTER_USER)
    except KeyError:
        pytest.skip(f"no user {SQUATTER_USER} (scripts/bootstrap creates it)")


@pytest.fixture
def squatter() -> Iterator[Callable[..., list[int]]]:
    """Hold ports as an ordinary local user: `hold(0, 0)` -> the two ports it bound."""
    procs: list[subprocess.Popen[str]] = []

    def hold(*ports: int) -> list[int]:
        pw = squatter_account()
        proc = subprocess.Popen(
            ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
             "/usr/bin/python3", "-c", HOLD, *map(str, ports)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env(),
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "the squatter said nothing"
        return [int(p) for p in line.split()]

    yield hold
    for proc in procs:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(10)


def status(d: DaemonProcess) -> pb.DaemonStatus:
    with d.kernels() as kernels:
        return kernels.GetStatus(pb.GetStatusRequest(), timeout=10)


def resolves(d: DaemonProcess) -> bool:
    """A job's Resolve over the user socket works (the daemon serves despite the listener)."""
    with d.kernels() as kernels:
        return bool(kernels.Resolve(resolve_req("kerneld-test/act"), timeout=60).kernel.path)


# ---- the decision itself ---------------------------------------------------------------------


def test_only_a_privileged_port_is_served_by_a_system_daemon() -> None:
    start = 1024
    for passed in (True, False):
        assert check_hub_endpoint("x", 848, system=True, passed=passed, start=start).serve
        for port in (1024, 8484, 0):
            exposure = check_hub_endpoint("x", port, system=True, passed=passed, start=start)
            assert not exposure.serve and "any local user may bind it" in exposure.refusal
            fix = "systemctl edit kerneld.socket" if passed else "enable kerneld.socket"
            assert fix in exposure.refusal, exposure
    user = check_hub_endpoint("x", 8484, system=False, passed=False, start=start)
    assert user.serve and "any local user may bind it" in user.warning
    # A namespace that lowered the bound (a container's, say) makes every port above it public.
    assert not check_hub_endpoint("x", 848, system=True, passed=True, start=0).serve
    assert 0 <= unprivileged_port_start() <= 65536


def test_the_shipped_socket_unit_listens_on_privileged_ports_only() -> None:
    unit = (SYSTEMD / "kerneld.socket").read_text()
    tcp = re.findall(r"^ListenStream=(?:[0-9.]+|\[[0-9a-f:]+\]):(\d+)$", unit, re.MULTILINE)
    assert tcp, "kerneld.socket has no TCP ListenStream="
    assert all(int(port) < 1024 for port in tcp), tcp


# ---- a daemon started by hand -----------------------------------------------------------------


@needs_root
def test_ports_another_user_holds_stop_nothing(
    make_daemon: Callable[..., DaemonProcess],
    kernel_mirror: Path,
    squatter: Callable[..., list[int]],
) -> None:
    hub_port, metrics_port = squatter(0, 0)
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={
            "hub_api": {"listen": f"127.0.0.1:{hub_port}"},
            "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        },
    )
    assert resolves(d)
    problems = list(status(d).listener_problems)
    assert len(problems) == 2, problems
    assert any(p.startswith("hub api:") and f":{hub_port}" in p for p in problems), problems
    assert any(p.startswith("metrics:") and f":{metrics_port}" in p for p in problems), problems
    assert all("in use" in p for p in problems), problems
    logs = d.logs()
    assert re.search(rf"ERROR .*hub api: not listening on http://127.0.0.1:{hub_port}", logs), logs


@needs_root
def test_a_system_daemon_does_not_bind_an_unprivileged_endpoint_port(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        args=["--system"],
        config={"hub_api": {"listen": "127.0.0.1:0"}},
    )
    assert resolves(d)
    assert list(status(d).hub_api) == []
    [problem] = status(d).listener_problems
    assert "is not served" in problem and "enable kerneld.socket" in problem, problem
    assert "hub api on http://" not in d.logs()


@needs_root
def test_a_system_daemon_holds_a_passed_unprivileged_port_and_refuses_on_it(
    tmp_path: Path, kernel_mirror: Path
) -> None:
    """A kerneld.socket drop-in with an unprivileged port: systemd keeps holding it (no one else
    can take it while the unit runs), and the daemon answers every connection with a 503 that
    says why and how to fix it, instead of serving kernels there."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(socket.SOMAXCONN)
    port = tcp.getsockname()[1]
    d = ActivatedDaemon(
        tmp_path / "d", mirror_dirs=[kernel_mirror], args=["--system"], passed=[("hub-api", tcp)]
    )
    try:
        d.start()
        assert resolves(d)
        answer = ask(port)
        assert answer.startswith("HTTP/1.1 503"), answer
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /api/kernels/kerneld-test/act/refs HTTP/1.0\r\n\r\n")
            text = s.makefile("rb").read().decode()
        assert "systemctl edit kerneld.socket" in text, text
        [problem] = status(d).listener_problems
        assert f"127.0.0.1:{port} is not served" in problem, problem
    finally:
        d.close()
        tcp.close()


@needs_root
def test_a_user_daemon_warns_that_its_endpoint_port_can_be_taken(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], config={"hub_api": {"listen": "127.0.0.1:0"}})
    line = d.wait_for_log("any local user may bind it")
    assert "WARNING" in line and "kerneld.socket holds a privileged port" in line, line
    assert list(status(d).hub_api) and not list(status(d).listener_problems)


# ---- under a real systemd -----------------------------------------------------------------------

#: Tries to bind `argv[1..]` on loopback every millisecond until `argv[0]` exists; prints what
#: it won and how many tries it made. Ports it wins it keeps (a squatter would).
SQUAT_LOOP = r"""
import errno, json, os, socket, sys, time
stop, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
tries, won, errors, held = 0, {}, {}, []
while not os.path.exists(stop):
    for port in ports:
        if str(port) in won:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen(8)
            won[str(port)] = tries
            held.append(s)
        except OSError as exc:
            errors[errno.errorcode.get(exc.errno, str(exc.errno))] = 1 + errors.get(
                errno.errorcode.get(exc.errno, str(exc.errno)), 0)
            s.close()
        tries += 1
    time.sleep(0.001)
print(json.dumps({"tries": tries, "won": won, "errors": errors}))
"""

CONFIG = """# tests/security/test_port_squat.py: a mirror directory instead of the Hub (no network)
[[upstream]]
name = "site"
kind = "mirror-dir"
path = "/srv/kernel-mirror"

[prefetch]
on_start = false

[metrics]
listen = "127.0.0.1:{metrics_port}"

[trust]
allow = ["kerneld-test/*"]
"""


@pytest.mark.systemd
@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_root
def test_no_local_user_gets_the_endpoint_port_across_restarts(
    tmp_path: Path, kernel_mirror: Path
) -> None:
    from tests.systemd.container import Container, ContainerUnavailable, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    squatter_account()
    unit = (SYSTEMD / "kerneld.socket").read_text()
    [endpoint] = [int(p) for p in re.findall(r"^ListenStream=127\.0\.0\.1:(\d+)$", unit, re.M)]
    metrics_port = 9464
    with Container(tmp_path / "c", f"kdsq-{os.getpid()}", private_network=True) as c:
        try:
            c.mount()
        except ContainerUnavailable as exc:
            pytest.skip(str(exc))
        install_units(c.root, metrics_port, kernel_mirror)
        c.boot()

        def ok(argv: list[str], **kw: object) -> str:
            ran = c.run(argv, **kw)  # type: ignore[arg-type]
            assert ran.rc == 0, str(ran)
            return ran.out

        ok(["systemctl", "enable", "--now", "kerneld.socket", "kerneld"], timeout=120)
        refs = f"http://127.0.0.1:{endpoint}/api/kernels/kerneld-test/act/refs"
        assert '"name":"v1"' in ok(["curl", "-sS", "--fail", refs])

        stop = "/tmp/squat-stop"
        pw = squatter_account()
        loop = subprocess.Popen(
            ["nsenter", f"--target={c.leader}", "--all", "setpriv", f"--reuid={pw.pw_uid}",
             f"--regid={pw.pw_gid}", "--clear-groups", "/usr/bin/python3", "-c", SQUAT_LOOP,
             stop, str(endpoint), str(metrics_port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        )  # fmt: skip
        try:
            time.sleep(0.5)
            ok(["systemctl", "restart", "kerneld"], timeout=120)
            pid = ok(["systemctl", "show", "-p", "MainPID", "--value", "kerneld"]).strip()
            ok(["kill", "-KILL", pid])  # a crash: Restart=on-failure brings it back after 2 s
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                now = ok(["systemctl", "show", "-p", "MainPID", "--value", "kerneld"]).strip()
                if now not in ("0", pid) and c.run(["systemctl", "is-active", "kerneld"]).rc == 0:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("kerneld did not come back after SIGKILL:\n" + c.tail())
            # docs/operations.md's port change, with the port kept: stop both, start both
            ok(["systemctl", "stop", "kerneld.socket", "kerneld"], timeout=120)
            time.sleep(0.5)
            started = c.run(["systemctl", "start", "kerneld.socket", "kerneld"], timeout=120)
        finally:
            c.run(["touch", stop])
            out, err = loop.communicate(timeout=30)
        squat = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        assert squat, err
        assert str(endpoint) not in squat["won"], squat  # the endpoint port: never
        assert started.rc == 0, str(started)
        assert squat["tries"] > 200 and set(squat["errors"]) >= {"EACCES"}, squat
        # the metrics port it did take during a restart: the daemon serves all the same
        assert str(metrics_port) in squat["won"], squat
        assert c.run(["systemctl", "is-active", "kerneld"]).out.strip() == "active"
        assert '"name":"v1"' in ok(["curl", "-sS", "--fail", refs])
        shown = ok(["/usr/bin/kerneldctl", "status"])
        assert f"NOT LISTENING: metrics: not listening on http://127.0.0.1:{metrics_port}" in shown


def install_units(root: Path, metrics_port: int, mirror: Path) -> None:
    """The shipped units, sysusers and tmpfiles files, with kerneld and kerneldctl from this
    checkout's venv (a drop-in lets the sandboxed service see the checkout wherever it is,
    /tmp included) and a config that reads a mirror directory copied into the container."""
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for name in ("kerneld.service", "kerneld.socket"):
        (units / name).write_text((SYSTEMD / name).read_text())
    dropin = units / "kerneld.service.d"
    dropin.mkdir(exist_ok=True)
    (dropin / "checkout.conf").write_text(f'[Service]\nBindReadOnlyPaths="{REPO_ROOT}"\n')
    for src, dst in (("kerneld.sysusers", "usr/lib/sysusers.d/kerneld.conf"),
                     ("kerneld.tmpfiles", "usr/lib/tmpfiles.d/kerneld.conf")):  # fmt: skip
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        (root / dst).write_text((SYSTEMD / src).read_text())
    for tool in ("kerneld", "kerneldctl"):
        link = root / "usr/bin" / tool
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(REPO_ROOT / ".venv" / "bin" / tool)
    etc = root / "etc/kerneld"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "kerneld.toml").write_text(CONFIG.format(metrics_port=metrics_port))
    srv = root / "srv/kernel-mirror"
    subprocess.run(["cp", "-a", f"{mirror}/.", str(srv)], check=True, timeout=60)
    subprocess.run(["chmod", "-R", "a+rX", str(root / "srv")], check=True, timeout=60)
