"""Transformers 5.22.2 and 5.25.0, each in a clean venv with the `kernels` release it resolves
(`transformers[kernels]==5.22.2`: kernels 0.17.2; 5.25.0 requires kernels>=0.19.1,<0.20) and
kerneld-client's start-up hook, on tiny random Llama, Qwen2, Mixtral and Qwen3-MoE models with
`use_kernels` at its default: on in 5.25 (`USE_HUB_KERNELS` unset), off in 5.22.2 (its
`from_pretrained` pops `use_kernels` with default False), where the default loads plain PyTorch
and asks no kernel of anybody, so 5.22.2 is also run with `use_kernels=True`.

Transformers' own kernel mapping names `kernels-community/liger-kernels` (RMSNorm),
`activation` (SiLU) and `rotary` (rotary_pos_emb) for GPUs only; the child registers each
kind's `cuda` entry for `cpu` as well (tests/integrations/_tf_models_child.py), and the Hub test
server serves stand-ins of those repos built from the example kernels
(tests/integrations/transformers_hub.py). Every marked layer's forward is then the stand-in
kernel's, loaded from the daemon's store (cold) or the published index (warm: no gRPC, no Hub
request), and the logits equal PyTorch's. On a Hub that lacks some of the mapped repos (a GPU
node's mapping on an air-gapped mirror) every model still loads, with one KernelFallbackWarning
per missing repo naming it and the reason."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.kernels.built import BuiltExamples
from tests import deps
from tests.hubapi.venvs import TF_HOOK_RELEASES
from tests.integrations.support import ROOT, hook_env
from tests.integrations.transformers_hub import (
    ACTIVATION,
    COMMUNITY,
    LIGER,
    ROTARY,
    STANDINS,
    build_transformers_hub,
)
from tests.support import zygote
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

KERNELS_OF = {"5.22.2": "0.17.2", "5.25.0": "0.19.1"}
KINDS = ("RMSNorm", "SiLU", "rotary_pos_emb")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tf_venvs() -> dict[str, Path]:
    """Transformers release -> its venv with kerneld-client (`make test-deps` made them)."""
    return deps.tf_hook_venvs()


@pytest.fixture(scope="module")
def tf_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the children save the tiny models (made by the first child that needs them)."""
    return tmp_path_factory.mktemp("tf-models")


def _serve(
    tmp_path_factory: pytest.TempPathFactory,
    built_examples: BuiltExamples,
    repos: tuple[str, ...],
) -> Iterator[HubServer]:
    root = build_transformers_hub(tmp_path_factory.mktemp("tf-hub"), built_examples, repos=repos)
    with HubServer(root, trusted_orgs={COMMUNITY: True}) as server:
        yield server


@pytest.fixture(scope="module")
def tf_hub(
    tmp_path_factory: pytest.TempPathFactory, built_examples: BuiltExamples
) -> Iterator[HubServer]:
    """Stand-ins for every repo Transformers maps these models' kinds to."""
    yield from _serve(tmp_path_factory, built_examples, STANDINS)


@pytest.fixture(scope="module")
def tf_hub_lacking(
    tmp_path_factory: pytest.TempPathFactory, built_examples: BuiltExamples
) -> Iterator[HubServer]:
    """A mirror with only kernels-community/activation: liger-kernels and rotary are missing."""
    yield from _serve(tmp_path_factory, built_examples, (ACTIVATION,))


def run_models(
    python: Path,
    args: dict[str, Any],
    env: dict[str, str],
    timeout: float = 300,
    *,
    child: str = "tests.integrations._tf_models_child",
) -> dict[str, Any]:
    proc = zygote.run_python(
        ["-m", child, json.dumps(args)], env=env, cwd=ROOT, timeout=timeout, python=python
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def fallback_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": KernelFallbackWarning: " in line]


def assert_all_kernelized(out: dict[str, Any], store: Path) -> float:
    """Every marked layer of every model runs the stand-in's forward out of the store, and the
    logits equal PyTorch's; the largest logit difference."""
    worst = 0.0
    for family, model in out["models"].items():
        layers = model["layers"]
        for kind in KINDS:
            layer = layers.get(kind)
            assert layer and layer["count"] > 0, (family, kind, layers)
            assert layer["kernelized"] == layer["count"], (family, kind, layer, out["stderr"])
            assert layer["files"] and all(Path(f).is_relative_to(store) for f in layer["files"])
        assert model["max_err"] < TOLERANCE, (family, model["max_err"])
        worst = max(worst, model["max_err"])
    return worst


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", list(TF_HOOK_RELEASES))
def test_transformers_loads_the_models_through_the_hook(
    release: str,
    tf_venvs: dict[str, Path],
    tf_models: Path,
    tf_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    tf_hub.reset()
    daemon = make_daemon(hub_endpoint=tf_hub.url)
    python = tf_venvs[release]
    env = {**hook_env(tmp_path, tf_hub, daemon), "PYTHONPATH": str(ROOT)}
    store = daemon.store_root.resolve()
    args: dict[str, Any] = {"models": str(tf_models)}

    default = run_models(python, args, env)
    assert default["transformers"] == release and default["kernels"] == KERNELS_OF[release]
    assert default["hooked"] is True
    mapped = default["mapped"]
    assert mapped["RMSNorm"] == [f"{LIGER}:LigerRMSNorm"]  # Transformers' own repos
    assert mapped["SiLU"] == [f"{ACTIVATION}:Silu"]
    assert mapped["rotary_pos_emb"] == [f"{ROTARY}:apply_rotary_transformers"]
    if release == "5.22.2":
        # `use_kernels` defaults to False: plain PyTorch, no kernel asked of anybody.
        for family, model in default["models"].items():
            assert model["use_kernels"] is False, family
            assert all(layer["kernelized"] == 0 for layer in model["layers"].values()), model
            assert model["max_err"] == 0.0
        assert default["kerneld_repos"] == [] and tf_hub.total() == 0, dict(tf_hub.counts)
        args["use_kernels"] = True
        cold = run_models(python, args, env)
    else:
        cold = default
    assert all(model["use_kernels"] is True for model in cold["models"].values())
    assert_all_kernelized(cold, store)
    assert cold["kerneld_repos"] == sorted(STANDINS)
    assert "daemon" in cold["kerneld_sources"] and cold["grpc"] is True
    assert tf_hub.counts["resolve_get"] > 0  # the daemon's download, once for the host
    assert fallback_warnings(cold["stderr"]) == [], cold["stderr"]

    tf_hub.reset_counts()
    warm = run_models(python, args, env)
    worst = assert_all_kernelized(warm, store)
    assert warm["kerneld_sources"] == ["index"] and warm["grpc"] is False
    assert tf_hub.total() == 0, dict(tf_hub.counts)
    assert fallback_warnings(warm["stderr"]) == [], warm["stderr"]
    print(f"transformers {release}: max abs logit difference {worst:.3g}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_gpu_mapping_on_a_mirror_that_lacks_repos_loads_with_one_warning_per_repo(
    tf_venvs: dict[str, Path],
    tf_models: Path,
    tf_hub_lacking: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """Transformers 5.25 (`use_kernels` on by default) with its GPU mapping, on a mirror that has
    kernels-community/activation but not liger-kernels or rotary: all four models load; SiLU
    comes from the store, RMSNorm and rotary keep PyTorch; one warning per missing repo for the
    whole process (four models, 30 RMSNorm layers), each naming the repo and the reason."""
    daemon = make_daemon(hub_endpoint=tf_hub_lacking.url)
    env = {**hook_env(tmp_path, tf_hub_lacking, daemon), "PYTHONPATH": str(ROOT)}
    out = run_models(tf_venvs["5.25.0"], {"models": str(tf_models)}, env)
    store = daemon.store_root.resolve()
    for family, model in out["models"].items():
        layers = model["layers"]
        assert layers["SiLU"]["kernelized"] == layers["SiLU"]["count"] > 0, (family, layers)
        assert all(Path(f).is_relative_to(store) for f in layers["SiLU"]["files"])
        assert layers["RMSNorm"]["count"] > 0 and layers["RMSNorm"]["kernelized"] == 0, layers
        assert layers["rotary_pos_emb"]["kernelized"] == 0, layers
        assert model["max_err"] < TOLERANCE, (family, model["max_err"])
    assert out["kerneld_repos"] == [ACTIVATION]
    warned = fallback_warnings(out["stderr"])
    print(*warned, sep="\n")
    assert len(warned) == 2, out["stderr"]
    for repo in (LIGER, ROTARY):
        (line,) = [w for w in warned if repo in w]
        assert "not found" in line.lower() or "no such" in line.lower(), line
