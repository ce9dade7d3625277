"""docs/operations.md "Install as a systemd service", run word for word under a real systemd.

A fresh Debian host is a container (`tests/systemd/container.py`: systemd as PID 1 on an overlay
of this machine's root, with the kerneld user and groups removed from it). The test creates the
users the docs' `usermod` lines name, runs the docs' install block verbatim from the repository
root, then works the service as its users would:

- readiness (`Type=notify`: `systemctl enable --now` returned once it was serving) and the socket
  owners and modes of the docs' table;
- `/etc/kerneld/kerneld.toml` pointed at two loopback mirrors (`mirror-http`, served by this test;
  the Hub dropped: no network) and a metrics socket, applied by `systemctl reload`; a rejected
  file makes `systemctl reload` fail and changes nothing;
- the docs' `curl --unix-socket` metrics command as a `kerneld-admin` member (refused to others);
- a `kerneld-users` member's job loads a real torch kernel cold (the daemon fetches it) and warm
  (the published index, no upstream request);
- users outside `kerneld-admin` cannot use the admin socket;
- a `kerneld-admin` member's `kerneldctl prefetch`, published by the daemon as `User=kerneld`;
- the Hub API endpoint on kerneld.socket's port (a drop-in, as the docs' `systemctl edit`), and
  `systemctl restart kerneld` while clients connect: no connection refused, every one answered;
- `systemctl stop kerneld.socket kerneld`: clean exit, sockets gone.

pip installs the docs' `pip install ./client .` offline from a wheelhouse of the dependencies of
kerneld and kerneld-client (tests/systemd/wheelhouse.py: made once, by `make test-deps`, in the
suite's cache outside the clone).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from examples.main_job import MirrorServer
from examples.mirror import build_example_mirror
from tests.support.daemon import REPO_ROOT
from tests.systemd.container import (
    Container,
    ContainerUnavailable,
    Ran,
    unavailable_reason,
)
from tests.systemd.wheelhouse import wheelhouse

OPERATIONS = REPO_ROOT / "docs" / "operations.md"
KERNEL = "kerneld-examples/activation"  # a real torch kernel (C++ CPU ops), loaded by alice
PREFETCHED = "kerneld-test/act:1"  # prefetched by bob, from the kernel_mirror fixture
USERS = {"alice": "kerneld-users", "bob": "kerneld-admin", "carol": None}
ACCOUNTS = ("kerneld", "kerneld-users", "kerneld-admin")
#: What the install creates; gone from the container's file system before the docs run.
INSTALLED_PATHS = (
    "opt/kerneld",
    "usr/bin/kerneld",
    "usr/bin/kerneldctl",
    "usr/lib/systemd/system/kerneld.service",
    "usr/lib/systemd/system/kerneld.socket",
    "etc/systemd/system/kerneld.service",
    "etc/systemd/system/kerneld.socket",
    "etc/systemd/system/kerneld.socket.d",
    "etc/systemd/system/multi-user.target.wants/kerneld.service",
    "etc/systemd/system/sockets.target.wants/kerneld.socket",
    "usr/lib/sysusers.d/kerneld.conf",
    "usr/lib/tmpfiles.d/kerneld.conf",
    "etc/kerneld",
    "var/lib/kerneld",
    "var/cache/kerneld",
)
#: alice's job: load the kernel, check one op against PyTorch, say how the kernel came.
JOB = """
import json, torch
from kerneld_client import get_kernel, loaded_kernels
act = get_kernel({kernel!r}, version=1)
x = torch.randn(8, 64)
ok = torch.allclose(act.silu_and_mul_alloc(x), torch.nn.functional.silu(x[:, :32]) * x[:, 32:],
                    atol=1e-5)
print(json.dumps({{"ok": bool(ok), "loaded": [[k.repo_id, k.source, k.variant, str(k.path)]
                                           for k in loaded_kernels()]}}))
"""

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(420)]


# ---- what the docs say ----------------------------------------------------------------------


def install_section() -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    return text.split("\n## Install as a systemd service\n", 1)[1].split("\n## ", 1)[0]


def install_block() -> str:
    """The shell block of the install section that enables the service."""
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", install_section(), re.DOTALL)
    found = [b for b in blocks if "systemctl enable --now kerneld" in b]
    assert len(found) == 1, f"expected one install block in docs/operations.md, got {found}"
    return found[0]


def upgrade_block() -> str:
    """The shell block of the Upgrading section."""
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split("\n## Upgrading\n", 1)[1].split("\n## ", 1)[0]
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    found = [b for b in blocks if "systemctl restart kerneld" in b]
    assert len(found) == 1, f"expected one upgrade block in docs/operations.md, got {found}"
    return found[0]


def documented_paths() -> dict[str, tuple[int, str, str]]:
    """path -> (mode, owner, group) from the install section's table: sockets and the store."""
    rows = re.findall(
        r"^\| `(/run/kerneld/[^`]+\.sock|/var/lib/kerneld/store)` \| (0[0-7]{3}) "
        r"`([\w-]+):([\w-]+)` \|",
        install_section(),
        re.MULTILINE,
    )
    return {path: (int(mode, 8), owner, group) for path, mode, owner, group in rows}


def documented_curl() -> list[str]:
    (command,) = set(re.findall(r"`(curl --unix-socket [^`]+)`", OPERATIONS.read_text()))
    return shlex.split(command)


# ---- the host -------------------------------------------------------------------------------


def fresh_host(c: Container) -> None:
    """Make the overlay a host kerneld was never installed on (this machine's set-up created
    the kerneld user and groups for the suite)."""
    for name in ("passwd", "group", "shadow", "gshadow"):
        path = c.root / "etc" / name
        if not path.exists():
            continue
        kept = []
        for line in path.read_text().splitlines():
            fields = line.split(":")
            if fields[0] in ACCOUNTS:
                continue
            if name in ("group", "gshadow"):
                members = [m for m in fields[-1].split(",") if m and m != "kerneld"]
                fields[-1] = ",".join(members)
            kept.append(":".join(fields))
        path.write_text("\n".join(kept) + "\n")
    for rel in INSTALLED_PATHS:
        path = c.root / rel
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def free_privileged_port() -> int:
    """A loopback port below 1024 that nothing holds now (the test runs as root)."""
    for port in range(1000, 600, -1):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port between 601 and 1000")


def mirror_config(example_url: str, test_url: str, hub_api_port: int) -> str:
    return f"""# written by tests/systemd/test_install.py: loopback mirrors instead of the Hub
[[upstream]]
name = "examples"
kind = "mirror-http"
url = "{example_url}"

[[upstream]]
name = "test-kernels"
kind = "mirror-http"
url = "{test_url}"

[prefetch]
on_start = false

[metrics]
socket = "/run/kerneld/metrics.sock"

[server]
drain_timeout = "5s"

[hub_api]
listen = "127.0.0.1:{hub_api_port}"

[trust]
# the site's own kernels: a mirror-only daemon cannot ask the Hub who is trusted
allow = ["kerneld-examples/*", "kerneld-test/*"]
"""


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Container]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with Container(tmp_path / "c", f"kd-{os.getpid()}") as c:
        try:
            c.mount()
        except ContainerUnavailable as exc:
            pytest.skip(str(exc))
        fresh_host(c)
        c.boot()
        yield c


# ---- checks ---------------------------------------------------------------------------------


def ok(ran: Ran, what: str) -> Ran:
    assert ran.rc == 0, f"{what}:\n{ran}"
    return ran


def show(c: Container, prop: str) -> str:
    return ok(c.run(["systemctl", "show", "-p", prop, "--value", "kerneld"]), prop).out.strip()


def wait_journal(c: Container, needle: str, timeout: float = 10.0) -> str:
    """The service's journal once it contains `needle` (journald writes asynchronously)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = c.journal("kerneld")
        if needle in text:
            return text
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not in the journal of kerneld:\n{text[-4000:]}")


@dataclass(frozen=True)
class Loaded:
    """One kernel a job loaded, as `kerneld_client.loaded_kernels()` describes it."""

    repo_id: str
    source: str  # "daemon": asked the daemon (cold); "index": the published index (warm)
    variant: str
    path: str


def job(c: Container, user: str, env: dict[str, str] | None = None) -> list[Loaded]:
    """Run alice's job as `user`; what it loaded (its op was checked against PyTorch)."""
    python = str(REPO_ROOT / ".venv" / "bin" / "python")
    ran = c.run(
        [python, "-c", JOB.format(kernel=KERNEL)],
        user=user,
        env={"KERNELD_REQUIRE": "1", **(env or {})},  # a fallback to PyTorch is an error here
        timeout=120,
    )
    doc = json.loads(ok(ran, f"{user}'s job").out.strip().splitlines()[-1])
    assert doc["ok"], f"{user}'s job: the kernel's op disagrees with PyTorch:\n{ran}"
    return [Loaded(*entry) for entry in doc["loaded"]]


def requests_during(
    c: Container, port: int, command: list[str], timeout: float = 120.0
) -> tuple[Counter[str], int]:
    """GET the Hub API's refs every 10 ms from 4 connections from before `command` runs in the
    container (for at most `timeout` s) until after it returned: status line (or "refused") ->
    count, and how many requests were made while it ran."""
    request = f"GET /api/kernels/{KERNEL}/refs HTTP/1.0\r\n\r\n".encode()
    got: Counter[str] = Counter()
    starts: list[float] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            starts.append(time.monotonic())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(request)
                    line = s.makefile("rb").readline().decode(errors="replace").split()
                    got[line[1] if len(line) > 1 else "no answer"] += 1
            except ConnectionRefusedError:
                got["refused"] += 1
            except OSError as exc:
                got[f"error {exc}"] += 1
            time.sleep(0.01)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for t in clients:
        t.start()
    time.sleep(0.3)
    began = time.monotonic()
    ok(c.run(command, timeout=timeout), " ".join(command))
    ended = time.monotonic()
    time.sleep(0.3)
    stop.set()
    for t in clients:
        t.join(40)
    return got, sum(1 for t in starts if began <= t <= ended)


class Laps:
    """Where the minute goes (printed at the end; `-s` shows it)."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.laps: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = now - self.t
        self.t = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {s:.1f} s" for name, s in self.laps.items())


@pytest.mark.slow
def test_documented_install_under_systemd(
    container: Container,
    built_examples: BuiltExamples,
    kernel_mirror: Path,
) -> None:
    c = container
    lap = Laps()
    lap.laps["boot"] = c.boot_s
    python = ok(c.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]), "py")
    wheels = wheelhouse(python.out.strip())
    example_mirror = build_example_mirror(built=built_examples).root
    for user in USERS:  # the users the docs' `usermod` lines name (this host may have them)
        if c.run(["id", user]).rc != 0:
            ok(c.run(["useradd", "--create-home", user]), f"useradd {user}")
    lap("wheelhouse and users")

    # -- the docs' block, verbatim, from the repository root -----------------------------------
    pip_env = {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    # Each traced command with the time it started (kept in the failure output).
    trace = "PS4='+ [${EPOCHREALTIME}] '"
    script = f"{trace}\ncd {shlex.quote(str(REPO_ROOT))}\n{install_block()}"
    install = c.run(
        ["bash", "-e", "-x", "-o", "pipefail", "-s"], stdin=script, env=pip_env, timeout=240
    )
    ok(install, "the install block of docs/operations.md")
    lap("install block")
    print("\n" + "\n".join(line for line in install.err.splitlines() if line.startswith("+ [")))
    assert "ready" in install.out, install  # its last line: `kerneldctl status`

    # -- readiness and who the daemon is -----------------------------------------------------
    assert c.run(["systemctl", "is-active", "kerneld"]).out.strip() == "active"
    assert show(c, "Type") == "notify"
    assert show(c, "StatusText").startswith("serving"), show(c, "StatusText")
    main_pid = show(c, "MainPID")
    daemon_user = ok(c.run(["stat", "-c", "%U", f"/proc/{main_pid}"]), "stat").out.strip()
    assert daemon_user == "kerneld"
    for user, group in USERS.items():
        groups = ok(c.run(["id", "-nG", user]), "id").out.split()
        assert (group in groups) if group else not set(groups) & {"kerneld-users", "kerneld-admin"}

    # -- configure: loopback mirrors, metrics socket; reload applies, a bad file is refused ----
    with MirrorServer(example_mirror) as examples, MirrorServer(kernel_mirror) as test_kernels:
        config = c.root / "etc" / "kerneld" / "kerneld.toml"
        # A free privileged port (the container shares this machine's network; a system daemon
        # serves the endpoint on no other, tests/security/test_port_squat.py).
        hub_api_port = free_privileged_port()
        good = mirror_config(examples.url, test_kernels.url, hub_api_port)
        config.write_text(good)
        ok(c.run(["systemctl", "reload", "kerneld"]), "systemctl reload (valid file)")
        journal = wait_journal(c, "configuration reloaded:")
        assert "applied" in journal and "upstream" in journal, journal[-2000:]

        config.write_text(good.replace('drain_timeout = "5s"', 'drain_timeout = "soon"'))
        bad = c.run(["systemctl", "reload", "kerneld"])
        assert bad.rc != 0, f"systemctl reload accepted a file the daemon rejects:\n{bad}"
        journal = wait_journal(c, "configuration not reloaded")
        assert "server.drain_timeout" in journal and str(config.relative_to(c.root)) in journal
        assert c.run(["systemctl", "is-active", "kerneld"]).out.strip() == "active"
        assert show(c, "MainPID") == main_pid  # the same daemon, still serving
        config.write_text(good)
        ok(c.run(["systemctl", "reload", "kerneld"]), "systemctl reload (fixed file)")
        lap("reloads")

        # The metrics socket takes a restart; the rest of the test runs on the restarted daemon.
        # The Hub API's port is kerneld.socket's (the docs' `systemctl edit kerneld.socket`):
        # a free one, since the container shares this machine's network.
        dropin = c.root / "etc" / "systemd" / "system" / "kerneld.socket.d"
        dropin.mkdir(parents=True, exist_ok=True)
        (dropin / "port.conf").write_text(
            f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{hub_api_port}\n"
            "ListenStream=/run/kerneld/hub-api.sock\n"
        )
        ok(c.run(["systemctl", "daemon-reload"]), "daemon-reload")
        # (not `restart kerneld.socket kerneld`: systemd restarts the socket first and refuses
        # to while its service runs)
        ok(c.run(["systemctl", "stop", "kerneld.socket", "kerneld"]), "systemctl stop")
        ok(c.run(["systemctl", "start", "kerneld.socket", "kerneld"]), "systemctl start")
        assert c.run(["systemctl", "is-active", "kerneld"]).out.strip() == "active"
        lap("restart")

        # -- sockets as documented ------------------------------------------------------------
        # (the store root too: only kerneld-users may read it, issue 16 §3.12)
        documented = documented_paths()
        assert {
            "/run/kerneld/kerneld.sock",
            "/run/kerneld/admin.sock",
            "/run/kerneld/metrics.sock",
            "/var/lib/kerneld/store",
        } <= set(documented), documented
        for path, (mode, owner, group) in documented.items():
            st = ok(c.run(["stat", "-c", "%a %U %G %F", path]), f"stat {path}").out.split(" ", 3)
            assert (int(st[0], 8), st[1], st[2]) == (mode, owner, group), (path, st)
            kind = "directory" if path.endswith("/store") else "socket"
            assert st[3].strip() == kind, (path, st)

        # -- metrics: the docs' curl for a kerneld-admin member, nobody else -----------------
        curl = documented_curl()
        scraped = ok(c.run(curl, user="bob"), "bob: the docs' curl command")
        assert re.search(r"^kerneld_ready 1\.0$", scraped.out, re.MULTILINE), scraped
        for user in ("alice", "carol"):
            refused = c.run(curl, user=user)
            assert refused.rc != 0 and "kerneld_ready" not in refused.out, refused

        # -- a kerneld-users member's job: cold (the daemon fetches), then warm ----------------
        before = examples.requests
        [cold] = job(c, "alice")
        assert (cold.repo_id, cold.source) == (KERNEL, "daemon"), cold
        assert "-cpu-" in cold.variant, cold  # the compiled C++ build, not a noarch one
        assert cold.path.startswith("/var/lib/kerneld/store/"), cold
        assert examples.requests > before, "the cold load did not reach the mirror"
        lap("cold job")
        before = examples.requests
        [warm] = job(c, "alice")
        assert (warm.repo_id, warm.source, warm.variant) == (KERNEL, "index", cold.variant), warm
        assert examples.requests == before, "the warm load asked the upstream"
        lap("warm job")

        # -- the Hub API endpoint (issue 24): kerneld-users members only, as the socket -------
        # Under the unit's sandbox (ProtectProc=invisible, User=kerneld) the daemon finds each
        # loopback connection's uid in /proc/net/tcp; alice's kernels is served from the store.
        refs = f"http://127.0.0.1:{hub_api_port}/api/kernels/{KERNEL}/refs"
        served = ok(c.run(["curl", "-sS", "--fail", refs], user="alice"), "alice: Hub API refs")
        assert '"name":"v1"' in served.out, served
        refused = c.run(["curl", "-sS", "-D", "-", "-o", "/dev/null", refs], user="carol")
        assert " 403 " in refused.out and "kerneld-users" in refused.out, refused
        lap("Hub API")

        # -- kerneld.socket: a restart while clients connect refuses none of them -------------
        got, during = requests_during(c, hub_api_port, ["systemctl", "restart", "kerneld"])
        assert got == {"200": got["200"]} and during >= 4, (got, during)
        assert show(c, "MainPID") != "0"
        lap("restart under clients")

        # -- outside kerneld-users: neither the socket nor the store (issue 16 §3.12) ----------
        python = str(REPO_ROOT / ".venv" / "bin" / "python")
        outsider = c.run(
            [python, "-c", JOB.format(kernel=KERNEL)],
            user="carol",
            env={"KERNELD_REQUIRE": "1"},
            timeout=120,
        )
        assert outsider.rc != 0 and "kerneld-users" in outsider.err, outsider
        listing = c.run(["ls", "/var/lib/kerneld/store/index"], user="carol")
        assert listing.rc != 0 and "Permission denied" in listing.err, listing
        lap("outsider job")

        # -- the admin socket is for kerneld-admin only ----------------------------------------
        for user in ("alice", "carol"):
            denied = c.run(["kerneldctl", "gc", "--dry-run"], user=user)
            assert denied.rc != 0 and "permission denied" in denied.err.lower(), denied
            raw = c.run(
                [
                    "python3",
                    "-c",
                    "import socket; s = socket.socket(socket.AF_UNIX); "
                    "s.connect('/run/kerneld/admin.sock')",
                ],
                user=user,
            )
            assert raw.rc != 0 and "PermissionError" in raw.err, raw

        # -- an admin's prefetch, published by the daemon as User=kerneld ----------------------
        before = test_kernels.requests
        ok(c.run(["kerneldctl", "prefetch", PREFETCHED], user="bob", timeout=120), "prefetch")
        assert test_kernels.requests > before
        listing = ok(c.run(["kerneldctl", "ls", "--json"], user="bob"), "kerneldctl ls").out
        assert PREFETCHED.partition(":")[0] in listing and KERNEL in listing, listing
        trees = ok(
            c.run(["bash", "-c", "stat -c '%U %a %n' /var/lib/kerneld/store/v1/trees/*"]),
            "stat trees",
        ).out.splitlines()
        assert len(trees) >= 2, trees  # alice's kernel and bob's
        lap("admin socket checks and prefetch")

        # -- `kerneldctl env`, as a job's user: from the published index (the daemon's SQLite is
        # its own), chosen for the job's interpreter, not /opt/kerneld's, which has no torch --
        env = c.run(["kerneldctl", "env", KERNEL, "--json"], user="alice")
        assert env.rc == 1 and "/opt/kerneld/bin/python" in env.err, env
        assert "has no torch" in env.err and "--python" in env.err, env
        env = c.run(["kerneldctl", "env", KERNEL, "--python", python, "--json"], user="alice")
        [mapped] = json.loads(ok(env, "kerneldctl env --python").out)["kernels"]
        assert (mapped["variant"], mapped["path"]) == (cold.variant, cold.path), (mapped, cold)
        # who may not read the store is told so (exit 5, what to do), never a traceback
        for user, argv in (
            ("carol", ["kerneldctl", "env", KERNEL]),
            ("carol", ["kerneldctl", "ls", "--store", "/var/lib/kerneld/store"]),
            ("alice", ["kerneldctl", "ls", "--store", "/var/lib/kerneld/store"]),
        ):
            denied = c.run(argv, user=user)
            assert denied.rc == 5 and "permission denied" in denied.err.lower(), denied
            assert "hint:" in denied.err and "Traceback" not in denied.err, denied
        lap("kerneldctl env")
        for line in trees:
            owner, perms, _ = line.split(" ", 2)
            assert owner == "kerneld" and not int(perms, 8) & 0o222, line  # sealed read-only

        # -- the install block again (safe to re-run), then the upgrade recipe ----------------
        again = c.run(
            ["bash", "-e", "-o", "pipefail", "-s"], stdin=script, env=pip_env, timeout=240
        )
        ok(again, "the install block of docs/operations.md, run a second time")
        assert config.read_text() == good, "re-running the install block replaced the config"
        running = show(c, "MainPID")
        upgrade = f"{trace}\ncd {shlex.quote(str(REPO_ROOT))}\n{upgrade_block()}"
        upgraded = c.run(
            ["bash", "-e", "-x", "-o", "pipefail", "-s"], stdin=upgrade, env=pip_env, timeout=240
        )
        ok(upgraded, "the upgrade block of docs/operations.md")
        assert "ready" in upgraded.out, upgraded
        assert show(c, "MainPID") not in ("0", running)  # a new daemon
        listing = ok(c.run(["kerneldctl", "ls", "--json"], user="bob"), "kerneldctl ls").out
        assert PREFETCHED.partition(":")[0] in listing and KERNEL in listing, listing  # kept
        before = examples.requests
        [after] = job(c, "alice")
        assert (after.source, after.variant) == ("index", cold.variant), after
        assert examples.requests == before, "a job after the upgrade asked the upstream"
        lap("re-install and upgrade")

    # -- stop: clean, sockets and advert gone ---------------------------------------------------
    ok(c.run(["systemctl", "stop", "kerneld.socket", "kerneld"], timeout=90), "systemctl stop")
    assert show(c, "ActiveState") == "inactive"
    assert (show(c, "Result"), show(c, "ExecMainStatus")) == ("success", "0")
    left = c.run(["bash", "-c", "ls -A /run/kerneld 2>/dev/null"]).out.split()
    assert not [n for n in left if n.endswith((".sock", ".json"))], left
    wait_journal(c, "stopped (SIGTERM)")
    lap("stop")
    print(f"\nsystemd install test: {lap}")
    if c.failed_units:
        print(f"units that failed in the container (not kerneld):\n{c.failed_units}")
