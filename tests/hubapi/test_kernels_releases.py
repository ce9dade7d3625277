"""Unmodified `kernels` releases (the newest 0.14, the newest 0.16, and 0.17.2), each in its own
venv from the package registry, load the example kernel with `HF_ENDPOINT` set to the daemon's
Hub API: cold (the daemon downloads, once), warm (the Hub hears nothing), with the Hub down
after warm-up, and refused with the administrator's reason when the kernel is denied. No hook,
no kerneld import in the job: the HTTP API is the whole contract."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples.kernels.specs import ORG
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT
from tests.hubapi.support import endpoint_of, hub_api_daemon
from tests.hubapi.venvs import KERNELS_RELEASES, run_in_venv
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

ACTIVATION = f"{ORG}/activation"
CHILD = Path(__file__).with_name("_kernels_release_child.py")


def job_env(tmp: Path, endpoint: str, name: str) -> dict[str, str]:
    """A job's environment: the daemon as its Hub, its own empty Hugging Face cache."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KERNELD_", "HF_", "KERNELS_", "LOCAL_KERNELS", "GRPC_", "PYTHON"))
    }
    home = tmp / name
    home.mkdir()
    env.update({"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HOME": str(home)})
    return env


def run_job(python: Path, env: dict[str, str], **args: Any) -> dict[str, Any]:
    return run_in_venv(python, CHILD, {"repo": ACTIVATION, "version": 1, **args}, env)


#: The first test to ask builds every venv (pip from the registry): minutes on a slow network.
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("release", KERNELS_RELEASES)
def test_a_kernels_release_loads_through_the_endpoint(
    release: str,
    release_venvs: dict[str, Path],
    make_daemon: Callable[..., DaemonProcess],
    example_hub_server: HubServer,
    tmp_path: Path,
) -> None:
    python = release_venvs[f"kernels=={release}"]
    d, endpoint = hub_api_daemon(make_daemon, hub_endpoint=example_hub_server.url)

    cold = run_job(python, job_env(tmp_path, endpoint, "cold"))
    assert cold["kernels"] == release
    assert cold.get("ops_ok") is True, cold
    assert Path(cold["file"]).is_relative_to(tmp_path / "cold")  # kernels' own cache
    assert example_hub_server.counts["resolve_get"] > 0  # the daemon's download for the host

    example_hub_server.reset_counts()
    warm = run_job(python, job_env(tmp_path, endpoint, "warm"))
    assert warm.get("ops_ok") is True, warm
    assert example_hub_server.total() == 0, example_hub_server.requests

    # The Hub down, and the daemon restarted meanwhile: jobs keep loading.
    example_hub_server.inject(Fault("*", "error", status=503))
    d.restart()
    endpoint = endpoint_of(d)
    down = run_job(python, job_env(tmp_path, endpoint, "down"))
    assert down.get("ops_ok") is True, down

    with d.admin() as admin:
        admin.Deny(pb.DenyRequest(repo_id=ACTIVATION, reason="advisory 7"), timeout=TIMEOUT)
    denied = run_job(python, job_env(tmp_path, endpoint, "denied"))
    assert "error" in denied and "advisory 7" in denied["message"], denied


def kernels_cli(python: Path, command: str, project: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [str(python.with_name("kernels")), command, str(project)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, f"kernels {command}:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kernels_lock_and_download_work_through_the_endpoint(
    release_venvs: dict[str, Path],
    make_daemon: Callable[..., DaemonProcess],
    example_hub_server: HubServer,
    tmp_path: Path,
) -> None:
    python = release_venvs["kernels==0.17.2"]
    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=example_hub_server.url)
    pyproject = f'[project]\nname = "demo"\n\n[tool.kernels.dependencies]\n"{ACTIVATION}" = 1\n'
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for project in (ours, theirs):
        project.mkdir()
        (project / "pyproject.toml").write_text(pyproject)

    env = job_env(tmp_path, endpoint, "job")
    kernels_cli(python, "lock", ours, env)
    kernels_cli(python, "lock", theirs, job_env(tmp_path, example_hub_server.url, "direct"))
    # The same lock as `kernels lock` straight against the Hub writes.
    assert (ours / "kernels.lock").read_text() == (theirs / "kernels.lock").read_text()

    example_hub_server.reset_counts()
    kernels_cli(python, "download", ours, env)
    assert list((tmp_path / "job").rglob("build/*/metadata.json")), "nothing downloaded"
    assert (
        example_hub_server.counts["resolve_get"] == 0
    )  # `lock` already had the daemon fetch it all
