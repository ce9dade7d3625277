"""Transformers' `from_pretrained(..., use_kernels=True)` served by kerneld with the start-up
hook: the real `transformers` package and a tiny random Llama saved to a temporary folder, its
RMSNorm mapped to the example kernel on the Hub test server, and a real daemon.

Llama's other hub-extensible layer kinds have no example kernel to map: its activation kind
`SiLU` is elementwise (the example's `SiluAndMul` is the gated silu(a) * b, a different shape),
and `rotary_pos_emb` is a function kernel the examples do not provide."""

from __future__ import annotations

from pathlib import Path

from tests.integrations.support import count_warnings, hook_env, run_child
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

NORMS = 2 * 2 + 1  # two per decoder layer, and the final one
TOLERANCE = 1e-4


def test_use_kernels_through_kerneld(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    env = hook_env(tmp_path, hub, hub_daemon)
    args = {"model": str(tmp_path / "model")}
    store = hub_daemon.store_root.resolve()

    cold = run_child("_transformers_child", args, env, timeout=300)
    assert cold["hooked"] is True
    assert (cold["norms"], cold["kernelized"]) == (NORMS, NORMS), cold
    (layer_file,) = cold["layer_files"]
    assert Path(layer_file).is_relative_to(store)  # the layer came out of kerneld's store
    assert Path(cold["direct_file"]).is_relative_to(store)
    assert "daemon" in cold["kerneld_sources"] and cold["grpc"] is True
    assert cold["max_err"] < TOLERANCE
    assert hub.counts["resolve_get"] > 0  # the daemon's download, once for the host

    hub.reset_counts()
    warm = run_child("_transformers_child", args, env, timeout=300)
    assert (warm["norms"], warm["kernelized"]) == (NORMS, NORMS)
    assert warm["layer_files"] == [layer_file]
    assert set(warm["kerneld_sources"]) == {"index"} and warm["grpc"] is False
    assert warm["max_err"] < TOLERANCE
    assert hub.total() == 0, dict(hub.counts)
    assert count_warnings(warm["stderr"], "KernelFallbackWarning") == 0

    # The daemon is gone (and with it the advert that told clients where the store is): the
    # model still loads and runs, through kernels' own resolver, with one warning for the one
    # layer kind (RMSNorm, five instances).
    assert hub_daemon.stop() == 0
    hub.reset_counts()
    down = run_child("_transformers_child", args, env, timeout=300)
    assert down["hooked"] is True
    assert (down["norms"], down["kernelized"]) == (NORMS, NORMS)
    assert not Path(down["layer_files"][0]).is_relative_to(store)  # kernels' own download
    assert down["kerneld_sources"] == []
    assert down["max_err"] < TOLERANCE
    assert hub.counts["resolve_get"] > 0
    assert count_warnings(down["stderr"], "KernelFallbackWarning") == 1, down["stderr"]


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
    args = {"model": str(tmp_path / "model"), "repo": missing, "direct": False}
    out = run_child("_transformers_child", args, env, timeout=300)
    assert out["hooked"] is True
    assert (out["norms"], out["kernelized"]) == (NORMS, 0), out
    assert out["max_err"] == 0.0
    warnings = [line for line in out["stderr"].splitlines() if ": KernelFallbackWarning: " in line]
    assert len(warnings) == 1 and missing in warnings[0], out["stderr"]
