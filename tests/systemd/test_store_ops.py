"""docs/operations.md's store operations, run word for word under a real systemd, and jobs
loading through `systemctl restart kerneld`.

On a fresh host (the container of `test_install.py`, installed by the docs' install block):
- "Backing up and restoring the store": the back-up block, the store lost (an empty one
  started), the restore block; the next job is warm (the published index, no upstream request);
- "Moving the store to another disk": the move block (stop, `mv` to /data/kerneld/store, the
  `[store] path` edit, the shipped `ReadWritePaths=` drop-in, `--check-config`, start); the next
  job is warm from the new path. Without the drop-in `kerneld --check-config` fails naming it,
  and a start fails naming the sandbox, not the disk;
- jobs loading in a loop across 3 `systemctl restart kerneld`, each one asking the daemon
  (`KERNELD_REF_MAX_AGE=0`: the ref is re-checked with it) with `KERNELD_REQUIRE=1` (a fallback
  is an error): every job is answered by the daemon, and the Hub API endpoint (kerneld.socket)
  answers every request meanwhile;
- "Uninstalling": the block, then nothing of kerneld is left.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
from collections import Counter

import pytest

from examples.kernels.built import BuiltExamples
from examples.main_job import MirrorServer
from examples.mirror import build_example_mirror
from tests.support.daemon import REPO_ROOT
from tests.systemd.container import Container
from tests.systemd.test_install import (
    JOB,
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

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(600)]

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


RESTARTS = "for i in 1 2 3; do sleep 2; systemctl restart kerneld; done; sleep 2"


def restart_loop(c: Container, port: int) -> tuple[list[dict[str, object]], Counter[str], int]:
    """Jobs (alice's, 3 at a time, each a fresh process that asks the daemon) in a loop while
    `systemctl restart kerneld` runs 3 times, and the Hub API asked meanwhile
    (`requests_during`): what each job loaded, and the endpoint's answers."""
    python = str(REPO_ROOT / ".venv" / "bin" / "python")
    results: list[dict[str, object]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            ran = c.run(
                [python, "-c", JOB.format(kernel=KERNEL)],
                user="alice",
                env={"KERNELD_REQUIRE": "1", "KERNELD_REF_MAX_AGE": "0"},
                timeout=120,
            )
            entry: dict[str, object] = {"rc": ran.rc, "err": ran.err[-2000:]}
            if ran.rc == 0:
                entry.update(json.loads(ran.out.strip().splitlines()[-1]))
            results.append(entry)

    workers = [threading.Thread(target=loop) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        got, during = requests_during(c, port, ["bash", "-ec", RESTARTS])
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=180)
    return results, got, during


def test_store_operations_and_restarts_under_systemd(
    container: Container,  # noqa: F811
    built_examples: BuiltExamples,
) -> None:
    c = container
    python = ok(c.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]), "py")
    wheels = wheelhouse(python.out.strip())
    example_mirror = build_example_mirror(built=built_examples).root
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
        results, got, during = restart_loop(c, port)
        failed = [r for r in results if r["rc"] != 0]
        assert not failed, failed[:3]
        sources = {tuple(k[:2]) for r in results for k in r["loaded"]}  # type: ignore[attr-defined]
        assert sources == {(KERNEL, "daemon")}, sources
        print(
            f"\n3 restarts: {len(results)} jobs, all answered by the daemon; Hub API: "
            f"{dict(got)}, {during} requests during the restarts"
        )
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
