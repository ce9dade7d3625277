"""Transformers 5.22.2 with `use_kernels=True` and no kerneld code in the job: `HF_ENDPOINT`
is the daemon's Hub API, `kernels` (0.17.2, unmodified: the start-up hook off) asks it, and
the model's RMSNorm layers run the example kernel, cold and then warm with the Hub silent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.client.support import client_env
from tests.hubapi.support import hub_api_daemon
from tests.integrations.support import count_warnings, run_child
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

NORMS = 2 * 2 + 1  # two per decoder layer, and the final one
TOLERANCE = 1e-4


def test_use_kernels_through_the_endpoint_without_the_hook(
    make_daemon: Callable[..., DaemonProcess], examples: HubServer, tmp_path: Path
) -> None:
    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=examples.url)
    args = {"model": str(tmp_path / "model")}
    for name in ("cold", "warm"):
        examples.reset_counts()
        env = client_env(
            None,
            tmp_path,
            HF_ENDPOINT=endpoint,
            HF_HOME=str(tmp_path / f"hf-{name}"),
            KERNELD_HOOK_KERNELS="0",
        )
        out = run_child("_transformers_child", args, env, timeout=300)
        assert out["hooked"] is False and out["kerneld_sources"] == []
        assert (out["norms"], out["kernelized"]) == (NORMS, NORMS), out
        (layer_file,) = out["layer_files"]
        assert Path(layer_file).is_relative_to(tmp_path / f"hf-{name}")  # kernels' own cache
        assert out["max_err"] < TOLERANCE
        assert count_warnings(out["stderr"], "UserWarning") == 0, out["stderr"]
        if name == "cold":
            assert examples.counts["resolve_get"] > 0  # the daemon's download
        else:
            assert examples.total() == 0, examples.requests
