"""docs/operations.md's store operations, run word for word under a real systemd, and jobs
loading through `systemctl restart kerneld`.

On a fresh host (the container of `test_install.py`, installed by the docs' install block):
- "Backing up and restoring the store": the back-up block, the store lost (an empty one
  started), the restore block; the next job is warm (the published index, no upstream request);
- "Moving the store to another disk": the move block (stop, `mv` to /data/kerneld/store, the
  `[store] path` edit, the shipped `ReadWritePaths=` drop-in, `--check-config`, start); the next
  job is warm from the new path. Without the drop-in `kerneld --check-config` fails naming it,
  and a start fails naming the sandbox, not the disk;
- 3 `systemctl restart kerneld` under load: around each, 12 native jobs (`kerneld_client`,
  `KERNELD_REQUIRE=1`: a fallback to PyTorch is an error; `KERNELD_REF_MAX_AGE=0`: each asks
  the daemon) and 6 endpoint jobs (an unmodified `kernels` 0.19.1 through the Hub API, an
  empty HF cache each) start every 0.15 s / 0.25 s (tests/systemd/restart_jobs.py), while the
  Hub API is asked every 10 ms. Each job's load is timed against the restart's window (systemd's
  monotonic timestamps: the old daemon leaving `active` to the new one's READY=1): every job
  is answered by the daemon, at least MIN_OVERLAPPING of them overlapped a window, and the
  Hub API answered every request;
- "Uninstalling": the block, then nothing of kerneld is left.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from examples.kernels.built import BuiltExamples
from examples.main_job import MirrorServer
from examples.mirror import build_example_mirror
from tests.hubapi.venvs import make_venv, venv_root
from tests.support.daemon import REPO_ROOT
from tests.systemd.container import BASE_ENV, Container
from tests.systemd.test_install import (
    KERNEL,
    OPERATIONS,
    USERS,
    container,  # noqa: F401  (the fixture)
    free_privileged_port,
    install_block,
    job,
    mirror_config,
    ok,
    requests_during,
    show,
    wheelhouse,
)

pytestmark = [pytest.mark.systemd, pytest.mark.slow, pytest.mark.timeout(600)]

MOVED = "/data/kerneld/store"


def section_blocks(title: str) -> list[str]:
    """The shell blocks of one section of docs/operations.md, in order."""
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert blocks, f"no shell block in docs/operations.md, {title}"
    return blocks


def run_block(c: Container, block: str, what: str, env: dict[str, str] | None = None) -> str:
    """Run a docs block verbatim from the repository root (bash -e, traced); its stdout."""
    script = f"PS4='+ [${{EPOCHREALTIME}}] '\ncd {shlex.quote(str(REPO_ROOT))}\n{block}"
    ran = c.run(["bash", "-e", "-x", "-o", "pipefail", "-s"], stdin=script, env=env, timeout=240)
    return ok(ran, f"docs/operations.md, {what}").out


#: The load on each restart: job start times, seconds after the round's go time; the restart
#: begins RESTART_AT after it. Native jobs every 0.15 s, endpoint jobs every 0.25 s, from just
#: before the stop until past a slow start (the daemon is back 1-2.5 s after the stop here), so
#: a share of them meets the daemon stopping, gone, or starting, even where it restarts faster.
NATIVE_AT = [round(0.2 + i * 0.15, 2) for i in range(12)]
ENDPOINT_AT = [round(0.3 + i * 0.25, 2) for i in range(6)]
RESTART_AT = 0.5
ROUNDS = 3
#: Where the jobs' go files and HF caches live in the container.
LOAD_DIR = "/var/tmp/restart-load"
JOBS_SCRIPT = REPO_ROOT / "tests" / "systemd" / "restart_jobs.py"
MIN_OVERLAPPING = 10


@dataclass(frozen=True)
class Window:
    """One restart: from the old daemon leaving `active` (its stop began) to the new one
    `active` (READY=1), systemd's monotonic timestamps, in seconds."""

    stop_began: float
    ready: float

    def overlaps(self, job: dict[str, Any]) -> bool:
        return float(job["began"]) < self.ready and float(job["ended"]) > self.stop_began

    def contains(self, t: float) -> bool:
        return self.stop_began <= t <= self.ready


def restart_window(c: Container) -> Window:
    props = ("ActiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    values = [int(show(c, p)) / 1e6 for p in props]
    return Window(*values)


def start_jobs(
    c: Container, python: str, route: str, at: list[float], go: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    """restart_jobs.py as alice in the container, once it has imported what its jobs need."""
    args = {"route": route, "repo": KERNEL, "go": go, "at": at, "work": LOAD_DIR}
    argv = ["runuser", "-u", "alice", "--", python, str(JOBS_SCRIPT), json.dumps(args)]
    proc = subprocess.Popen(
        ["nsenter", f"--target={c.leader}", "--all", *argv],
        env={**BASE_ENV, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"{route} jobs did not start: {line!r} {proc.communicate()[1]}")
    return proc


def restart_round(
    c: Container, port: int, kernels_python: str, tag: int
) -> tuple[Window, list[dict[str, Any]]]:
    """One `systemctl restart kerneld` while native and endpoint jobs start around it; the
    restart's window and every job's record."""
    python = str(REPO_ROOT / ".venv" / "bin" / "python")
    go = f"{LOAD_DIR}/go-{tag}"
    runners = [
        start_jobs(c, python, "native", NATIVE_AT, go,
                   {"KERNELD_REQUIRE": "1", "KERNELD_REF_MAX_AGE": "0"}),
        start_jobs(c, kernels_python, "endpoint", ENDPOINT_AT, go,
                   {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HOME": "/home/alice"}),
    ]  # fmt: skip
    t0 = time.monotonic() + 0.3
    staged = c.root / f"{go}.tmp".lstrip("/")
    staged.write_text(repr(t0))  # whole or absent: the runners poll for it
    staged.rename(c.root / go.lstrip("/"))
    time.sleep(max(0.0, t0 + RESTART_AT - time.monotonic()))
    ok(c.run(["systemctl", "restart", "kerneld"], timeout=120), "systemctl restart kerneld")
    window = restart_window(c)
    assert t0 < window.stop_began < window.ready < time.monotonic(), (t0, window)  # this one
    jobs: list[dict[str, Any]] = []
    for runner in runners:
        out, err = runner.communicate(timeout=240)
        lines = out.splitlines()
        assert runner.returncode == 0 and lines[-1:] == ["done"], (runner.returncode, err[-3000:])
        jobs += [json.loads(line) for line in lines if line.startswith("{")]
    return window, jobs


def restarts_under_load(
    c: Container, port: int, kernels_python: str
) -> tuple[list[Window], list[dict[str, Any]], Counter[str], int]:
    """ROUNDS restarts under native and endpoint jobs while the Hub API is asked every 10 ms
    (`requests_during`, until the last round is over): the windows, the jobs, the API's
    answers and how many requests fell within the rounds."""
    ok(c.run(["install", "-d", "-m", "1777", LOAD_DIR]), "load dir")
    finished = f"{LOAD_DIR}/finished"
    windows: list[Window] = []
    jobs: list[dict[str, Any]] = []
    failure: list[BaseException] = []

    def rounds() -> None:
        try:
            for tag in range(ROUNDS):
                window, got = restart_round(c, port, kernels_python, tag)
                windows.append(window)
                jobs.extend(got)
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)
        finally:
            (c.root / finished.lstrip("/")).touch()

    driver = threading.Thread(target=rounds)
    driver.start()
    try:
        wait = f"while [ ! -e {finished} ]; do sleep 0.1; done"
        got, during = requests_during(c, port, ["bash", "-c", wait], timeout=400)
    finally:
        driver.join(timeout=600)
    if failure:
        raise failure[0]
    return windows, jobs, got, during


def test_store_operations_and_restarts_under_systemd(
    container: Container,  # noqa: F811
    built_examples: BuiltExamples,
) -> None:
    c = container
    python = ok(c.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]), "py")
    wheels = wheelhouse(python.out.strip())
    example_mirror = build_example_mirror(built=built_examples).root
    kernels_python = make_venv(venv_root(), ["kernels==0.19.1"])  # the endpoint route's jobs
    for user in USERS:
        if c.run(["id", user]).rc != 0:
            ok(c.run(["useradd", "--create-home", user]), f"useradd {user}")
    pip_env = {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    assert "ready" in run_block(c, install_block(), "install", pip_env)

    with MirrorServer(example_mirror) as examples:
        # The loopback mirror instead of the Hub, the store where the shipped file has it (the
        # move block edits that line), and kerneld.socket on a free port (as test_install.py).
        port = free_privileged_port()
        config = c.root / "etc" / "kerneld" / "kerneld.toml"
        config.write_text(
            mirror_config(examples.url, examples.url, port)
            + '\n[store]\npath = "/var/lib/kerneld/store"\n'
        )
        dropin = c.root / "etc" / "systemd" / "system" / "kerneld.socket.d"
        dropin.mkdir(parents=True, exist_ok=True)
        (dropin / "port.conf").write_text(
            f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{port}\n"
            "ListenStream=/run/kerneld/hub-api.sock\n"
        )
        ok(c.run(["systemctl", "daemon-reload"]), "daemon-reload")
        ok(c.run(["systemctl", "stop", "kerneld.socket", "kerneld"]), "stop")
        ok(c.run(["systemctl", "start", "kerneld.socket", "kerneld"]), "start")
        [cold] = job(c, "alice")
        assert cold.source == "daemon" and cold.path.startswith("/var/lib/kerneld/store/"), cold

        # -- back up, lose the store, restore: the next job is warm ---------------------------
        backup, restore = section_blocks("Backing up and restoring the store")
        run_block(c, backup, "back up")
        ok(c.run(["systemctl", "stop", "kerneld.socket", "kerneld"]), "stop")
        ok(c.run(["rm", "-rf", "/var/lib/kerneld/store"]), "lose the store")
        ok(c.run(["systemctl", "start", "kerneld.socket", "kerneld"]), "start on an empty store")
        restored = run_block(c, restore, "restore")
        assert "0 problems" in restored or "problem" not in restored.lower(), restored
        before = examples.requests
        [warm] = job(c, "alice")
        assert (warm.source, warm.variant, warm.path) == ("index", cold.variant, cold.path), warm
        assert examples.requests == before, "the job after the restore asked the upstream"

        # -- move the store to /data: the next job is warm, from there --------------------------
        (move,) = section_blocks("Moving the store to another disk")
        assert "ready" in run_block(c, move, "move the store")
        before = examples.requests
        [moved] = job(c, "alice")
        assert moved.source == "index" and moved.path.startswith(f"{MOVED}/"), moved
        assert moved.variant == cold.variant and examples.requests == before, moved

        # -- without the drop-in: --check-config names it, a start names the sandbox -----------
        store_conf = "/etc/systemd/system/kerneld.service.d/store.conf"
        ok(c.run(["mv", store_conf, "/root/store.conf"]), "drop-in aside")
        ok(c.run(["systemctl", "daemon-reload"]), "daemon-reload")
        check = c.run(
            ["kerneld", "--system", "--check-config", "--config", "/etc/kerneld/kerneld.toml"]
        )
        assert check.rc == 2 and f"ReadWritePaths={MOVED}" in check.err, check
        assert "systemctl edit kerneld" in check.err, check
        c.run(["systemctl", "restart", "kerneld"], timeout=90)  # fails: read-only for it
        journal = c.journal("kerneld")
        assert "Read-only file system" in journal and "sandbox" in journal, journal[-3000:]
        ok(c.run(["mv", "/root/store.conf", store_conf]), "drop-in back")
        ok(c.run(["systemctl", "daemon-reload"]), "daemon-reload")
        ok(c.run(["systemctl", "reset-failed", "kerneld"]), "reset-failed")
        ok(c.run(["systemctl", "start", "kerneld.socket", "kerneld"]), "start again")

        # -- 3 restarts under jobs that need the daemon, and the Hub API meanwhile -------------
        began = time.monotonic()
        windows, jobs, got, during = restarts_under_load(c, port, str(kernels_python))
        took = time.monotonic() - began
        failed = [j for j in jobs if not j.get("ok")]
        assert not failed, (
            "jobs failed (times: systemd's monotonic clock):\n"
            + "\n".join(json.dumps(j) for j in failed)
            + "\nrestart windows: "
            + ", ".join(f"{w.stop_began}-{w.ready}" for w in windows)
            + "\nthe daemon's journal, its end:\n"
            + c.journal("kerneld")[-6000:]
        )
        native = [j for j in jobs if j["route"] == "native"]
        sources = {tuple(k) for j in native for k in j["loaded"]}
        assert sources == {(KERNEL, "daemon")}, sources  # none on PyTorch, none skipped the daemon
        hit = {
            route: [j for j in jobs if j["route"] == route and any(w.overlaps(j) for w in windows)]
            for route in ("native", "endpoint")
        }
        inside = sum(1 for j in jobs if any(w.contains(float(j["began"])) for w in windows))
        print(
            f"\n{len(windows)} restarts (windows "
            + ", ".join(f"{w.ready - w.stop_began:.2f} s" for w in windows)
            + f"): {len(jobs)} jobs ({len(native)} native, {len(jobs) - len(native)} endpoint), "
            f"all loaded from the daemon; {len(hit['native'])} native and "
            f"{len(hit['endpoint'])} endpoint jobs overlapped a restart, {inside} started while "
            f"the daemon was stopping, gone or starting; Hub API: {dict(got)}, {during} requests "
            f"during the rounds ({took:.0f} s)"
        )
        assert len(hit["native"]) + len(hit["endpoint"]) >= MIN_OVERLAPPING, hit
        assert hit["native"] and hit["endpoint"], hit
        assert got == {"200": got["200"]} and during > 0, (got, during)

    # -- uninstall: nothing of kerneld left ------------------------------------------------------
    (uninstall,) = section_blocks("Uninstalling")
    run_block(c, uninstall, "uninstall")
    for path in (
        "/usr/lib/systemd/system/kerneld.service",
        "/etc/kerneld",
        "/var/lib/kerneld",
        "/data/kerneld",
        "/usr/bin/kerneldctl",
    ):
        assert c.run(["test", "-e", path]).rc != 0, f"{path} left after the uninstall block"
    assert c.run(["id", "kerneld"]).rc != 0
    assert c.run(["getent", "group", "kerneld-users"]).rc != 0
    assert show(c, "LoadState") == "not-found"
