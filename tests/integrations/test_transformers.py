"""Transformers' `from_pretrained(..., use_kernels=True)` served by kerneld with the start-up hook:
the real `transformers` package and a tiny random Llama saved to a temporary folder, three of its
hub layer kinds mapped to the example kernels on the Hub test server -- `RMSNorm` (a layer with
weights), `SiLU` (an elementwise activation) and `rotary_pos_emb` (a function kernel, kernelized
per attention layer) -- and a real daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.support import (
    LLAMA_KINDS,
    LLAMA_KINDS_KERNELS_0172,
    count_warnings,
    hook_env,
    kernelized,
    layer_files,
    run_child,
)
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

COUNTS = LLAMA_KINDS
REPOS = ["kerneld-examples/activation", "kerneld-examples/rotary"]
TOLERANCE = 1e-4


@pytest.mark.slow
def test_use_kernels_through_kerneld(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    env = hook_env(tmp_path, hub, hub_daemon)
    args = {"model": str(tmp_path / "model")}
    store = hub_daemon.store_root.resolve()

    cold = run_child("_transformers_child", args, env, timeout=300)
    assert cold["hooked"] is True
    assert {k: v["count"] for k, v in cold["layers"].items()} == COUNTS, cold
    assert kernelized(cold) == COUNTS, cold
    files = layer_files(cold)
    assert len(files) == 3  # activation's RMSNorm and Silu share a file; rotary has its own
    assert all(Path(f).is_relative_to(store) for f in files)  # every layer out of the store
    assert Path(cold["direct_file"]).is_relative_to(store)
    assert cold["kerneld_repos"] == REPOS
    assert "daemon" in cold["kerneld_sources"] and cold["grpc"] is True
    assert cold["max_err"] < TOLERANCE
    assert hub.counts["resolve_get"] > 0  # the daemon's download, once for the host

    hub.reset_counts()
    warm = run_child("_transformers_child", args, env, timeout=300)
    assert kernelized(warm) == COUNTS
    assert layer_files(warm) == files
    assert set(warm["kerneld_sources"]) == {"index"} and warm["grpc"] is False
    assert warm["max_err"] < TOLERANCE
    assert hub.total() == 0, dict(hub.counts)
    assert count_warnings(warm["stderr"], "KernelFallbackWarning") == 0

    # The daemon is gone (and with it the advert that told clients where the store is): the
    # model still loads and runs, through kerneld_client's verified Hub download (the hook's
    # default policy, what `kernels` would do), with one warning per repository (activation:
    # RMSNorm and SiLU; rotary).
    assert hub_daemon.stop() == 0
    hub.reset_counts()
    down = run_child("_transformers_child", args, env, timeout=300)
    assert down["hooked"] is True
    assert kernelized(down) == COUNTS
    assert not any(Path(f).is_relative_to(store) for f in layer_files(down))  # the hub cache
    assert set(down["kerneld_sources"]) == {"hub"}
    assert down["max_err"] < TOLERANCE
    assert hub.counts["resolve_get"] > 0
    warnings = [line for line in down["stderr"].splitlines() if ": KernelFallbackWarning: " in line]
    assert len(warnings) == 2, down["stderr"]
    assert all(any(repo in w for w in warnings) for repo in REPOS), warnings


def test_kerneld_layer_api_on_a_transformers_model(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The same three kinds with kerneld's own `register_kernel_mapping` and `kernelize` on a
    Transformers model: Transformers' marks are the ones `kernels` sets, which kerneld reads."""
    env = hook_env(tmp_path, hub, hub_daemon, KERNELD_HOOK_KERNELS="0")
    args = {"model": str(tmp_path / "model"), "api": "kerneld", "direct": False}
    out = run_child("_transformers_child", args, env, timeout=300)
    assert out["hooked"] is False
    # Without the hook the marks are those of the venv's `kernels` (0.17.2).
    assert kernelized(out) == LLAMA_KINDS_KERNELS_0172, out
    store = hub_daemon.store_root.resolve()
    assert all(Path(f).is_relative_to(store) for f in layer_files(out))
    assert out["kerneld_repos"] == REPOS
    assert out["max_err"] < TOLERANCE
    assert count_warnings(out["stderr"], "KernelFallbackWarning") == 0


def test_a_mapped_repo_nobody_has_keeps_pytorch_with_one_warning(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Issue 26 §4: Transformers maps layers to repos a site may not have (GPT-OSS's
    MegaBlocksMoeMLP). Neither kerneld nor the Hub has this one: the model still loads, every
    RMSNorm keeps its PyTorch forward, and one KernelFallbackWarning names the repo. (kernels
    formats the repo, resolving its version, in a log line before its fallback `try`; the hook
    used to hand that lookup back to kernels, whose Hub error then failed the load.)"""
    missing = "kerneld-examples/no-such-kernel"
    env = hook_env(tmp_path, hub, hub_daemon)
    model = str(tmp_path / "model")
    args = {"model": model, "repo": missing, "kinds": ["RMSNorm"], "direct": False}
    out = run_child("_transformers_child", args, env, timeout=300)
    assert out["hooked"] is True
    assert out["layers"]["RMSNorm"] == {"count": COUNTS["RMSNorm"], "kernelized": 0, "files": []}
    assert out["max_err"] == 0.0
    warnings = [line for line in out["stderr"].splitlines() if ": KernelFallbackWarning: " in line]
    assert len(warnings) == 1 and missing in warnings[0], out["stderr"]
