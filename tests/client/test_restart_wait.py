"""A job that finds the daemon restarting (its socket gone while the daemon is down) waits for
it, bounded by KERNELD_RESTART_WAIT, instead of skipping it for KERNELD_BACKOFF: against the
real daemon, stopped and started again while a job is waiting for it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.support import ACTIVATION, ROOT, client_env
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

#: The ref is re-checked with the daemon on every load (KERNELD_REF_MAX_AGE=0), so the source
#: says whether the daemon answered ("daemon") or the index was used without it ("index").
JOB = f"""
import json, sys
from pathlib import Path
import kerneld_client
from kerneld_client import loaded_kernels
Path(sys.argv[1]).touch()
kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
print(json.dumps({{"source": loaded_kernels()[0].source}}))
"""


@pytest.fixture
def hub_daemon(
    make_daemon: Callable[..., DaemonProcess], example_server: HubServer
) -> DaemonProcess:
    example_server.reset()
    return make_daemon(hub_endpoint=example_server.url)


def _env(daemon: DaemonProcess, tmp_path: Path, wait: str) -> dict[str, str]:
    return client_env(
        daemon.store_root,
        tmp_path,
        KERNELD_SOCKET=str(daemon.user_socket),
        KERNELD_REF_MAX_AGE="0",
        KERNELD_RESTART_WAIT=wait,
    )


def _warm_up(env: dict[str, str], tmp_path: Path) -> None:
    """The kernel into the store and its ref into the published index."""
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(JOB), str(tmp_path / "warmup")],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


def _job_while_down(
    daemon: DaemonProcess, env: dict[str, str], tmp_path: Path, *, down_for: float
) -> tuple[dict[str, str], bool]:
    """Start a job while the daemon is stopped; start the daemon after the job asked for it
    (`down_for` seconds after its start, or when it exited). Returns what the job loaded, and
    whether the job was still waiting when the daemon came back."""
    assert daemon.stop() == 0
    assert not daemon.user_socket.exists() and daemon.user_socket.parent.is_dir()
    started = tmp_path / "started"
    started.unlink(missing_ok=True)
    job = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(JOB), str(started)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(timeout=down_for)
        waiting = job.poll() is None
        daemon.start()
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, err
    result: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    result["stderr"] = err
    return result, waiting


def test_a_job_waits_for_a_restarting_daemon(hub_daemon: DaemonProcess, tmp_path: Path) -> None:
    env = _env(hub_daemon, tmp_path, "60")
    _warm_up(env, tmp_path)
    out, waiting = _job_while_down(hub_daemon, env, tmp_path, down_for=3)
    assert waiting, f"the job did not wait for the daemon:\n{out['stderr']}"
    assert out["source"] == "daemon", out["stderr"]


def test_without_the_wait_the_daemon_is_skipped(hub_daemon: DaemonProcess, tmp_path: Path) -> None:
    """KERNELD_RESTART_WAIT=0, as before the wait: the daemon counts as down at once, and the
    index's answer is loaded without it."""
    env = _env(hub_daemon, tmp_path, "0")
    _warm_up(env, tmp_path)
    out, waiting = _job_while_down(hub_daemon, env, tmp_path, down_for=60)
    assert not waiting and out["source"] == "index", out["stderr"]
