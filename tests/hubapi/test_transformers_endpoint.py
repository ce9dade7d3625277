"""Transformers 5.22.2 with `use_kernels=True` and no kerneld code in the job: `HF_ENDPOINT`
is the daemon's Hub API, `kernels` (0.17.2, unmodified: the start-up hook off) asks it, and
the model's RMSNorm, SiLU and rotary layers run the example kernels, cold and then warm with the
Hub silent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.support import client_env
from tests.hubapi.support import hub_api_daemon
from tests.hubapi.test_kernels_releases import ACTIVATION, job_env
from tests.hubapi.venvs import TRANSFORMERS_RELEASE, run_in_venv
from tests.integrations.support import (
    LLAMA_KINDS_KERNELS_0172,
    count_warnings,
    kernelized,
    layer_files,
    run_child,
)
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

CHILD = Path(__file__).with_name("_transformers_release_child.py")
NORMS = 2 * 2 + 1  # two per decoder layer, and the final one
TOLERANCE = 1e-4


@pytest.mark.slow
def test_use_kernels_through_the_endpoint_without_the_hook(
    make_daemon: Callable[..., DaemonProcess], example_hub_server: HubServer, tmp_path: Path
) -> None:
    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=example_hub_server.url)
    args = {"model": str(tmp_path / "model")}
    for name in ("cold", "warm"):
        example_hub_server.reset_counts()
        env = client_env(
            None,
            tmp_path,
            HF_ENDPOINT=endpoint,
            HF_HOME=str(tmp_path / f"hf-{name}"),
            KERNELD_HOOK_KERNELS="0",
        )
        out = run_child("_transformers_child", args, env, timeout=300)
        assert out["hooked"] is False and out["kerneld_sources"] == []
        # no hook: the marks are the venv's `kernels` 0.17.2's
        assert kernelized(out) == LLAMA_KINDS_KERNELS_0172, out
        files = layer_files(out)
        assert len(files) == 3  # RMSNorm and Silu share activation's layers.py
        assert all(Path(f).is_relative_to(tmp_path / f"hf-{name}") for f in files)  # kernels'
        assert out["max_err"] < TOLERANCE
        assert count_warnings(out["stderr"], "UserWarning") == 0, out["stderr"]
        if name == "cold":
            assert example_hub_server.counts["resolve_get"] > 0  # the daemon's download
        else:
            assert example_hub_server.total() == 0, example_hub_server.requests


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_newest_transformers_loads_kernels_through_the_endpoint(
    release_venvs: dict[str, Path],
    make_daemon: Callable[..., DaemonProcess],
    example_hub_server: HubServer,
    tmp_path: Path,
) -> None:
    """Transformers 5.25 requires `kernels>=0.19.1,<0.20`: the hook serves it too, and the
    endpoint is its route where nothing of kerneld's may be installed. A throw-away venv with
    exactly what the registry gives for `transformers==5.25.0`, cold then warm with the Hub
    silent."""
    python = release_venvs[f"transformers=={TRANSFORMERS_RELEASE}"]
    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=example_hub_server.url)
    for name in ("cold", "warm"):
        example_hub_server.reset_counts()
        env = job_env(tmp_path, endpoint, name)
        args = {"model": str(tmp_path / f"model-{name}"), "repo": ACTIVATION}
        out = run_in_venv(python, CHILD, args, env)
        assert out["transformers"] == TRANSFORMERS_RELEASE and out["kernels"].startswith("0.19")
        assert (out["norms"], out["kernelized"]) == (NORMS, NORMS), out
        (layer_file,) = out["layer_files"]
        assert Path(layer_file).is_relative_to(tmp_path / name)  # kernels' own cache
        assert out["max_err"] < TOLERANCE
        if name == "cold":
            assert example_hub_server.counts["resolve_get"] > 0  # the daemon's download
        else:
            assert example_hub_server.total() == 0, example_hub_server.requests
