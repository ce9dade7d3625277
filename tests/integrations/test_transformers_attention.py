"""Attention kernels from the Hub through Transformers 5.25 and kerneld (issue 53), in a clean
venv with the `kernels` release it resolves (0.19.1) and kerneld-client's start-up hook.

The example attention kernel (`kerneld-examples/attention`: flash-attn's interface on CPU,
examples/kernels/attention) is loaded by every form of `attn_implementation` Transformers takes
(`"org/repo"`, `"org/repo@rev"`, `"org/repo:fn"`) and by `set_attn_implementation`, from
kerneld's store; a left-padded batch's logits and greedy generate() with the cache equal SDPA's.
Warm, the process sends the Hub nothing. A missing repo, a revision the repo lacks and an
untrusted publisher fail `from_pretrained` (Transformers has no fallback for an attention kernel
it was asked for by name), as they do with `kernels` alone: docs/transformers.md says so."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from tests.client.support import client_env
from tests.hubapi.support import hub_api_daemon
from tests.hubapi.venvs import TF_HOOK_RELEASES, TRANSFORMERS_RELEASE, make_venv, venv_root
from tests.integrations.support import ROOT, hook_env
from tests.integrations.test_transformers_releases import run_models
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

ATTENTION = f"{ORG}/attention"
UNTRUSTED = "someone-else/attention"
#: What Transformers 5.25 asks for `"flash_attention_2"` without flash-attn installed (branch v4).
FLASH_ATTN2 = "kernels-community/flash-attn2"
TOLERANCE = 1e-4
CHILD = "tests.integrations._tf_attention_child"


@pytest.fixture(scope="module")
def tf_python() -> Path:
    """Transformers 5.25's venv with the hook (test_transformers_releases' "tf-hook"), from the
    suite's cache outside the clone (`make test-deps` made it), not built again per run."""
    requirements, name = TF_HOOK_RELEASES[TRANSFORMERS_RELEASE]
    return make_venv(venv_root(), requirements, name=name)


@pytest.fixture(scope="module")
def attention_hub(
    example_hub: HubRoot, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubServer]:
    """The example attention repo (trusted org), a copy of it under an untrusted org, and one as
    the stand-in of `kernels-community/flash-attn2` with its v1 build as branch `v4`."""
    root = tmp_path_factory.mktemp("attention-hub")
    source = example_hub.root / "kernels" / ATTENTION
    for repo in (ATTENTION, UNTRUSTED, FLASH_ATTN2):
        shutil.copytree(source, root / "kernels" / repo, symlinks=True)
    subprocess.run(
        ["git", "-C", str(root / "kernels" / FLASH_ATTN2), "branch", "v4", "v1"],
        check=True,
        capture_output=True,
    )
    with HubServer(root, trusted_orgs={ORG: True, "kernels-community": True}) as server:
        yield server


def _run(python: Path, args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    return run_models(python, args, env, child=CHILD)


def _assert_served(result: dict[str, Any], store: Path) -> None:
    assert "error" not in result, result
    assert result["max_err"] < TOLERANCE, result
    assert result["generate_equal"], result
    assert result["file"] and Path(result["file"]).is_relative_to(store), result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_attention_kernel_through_transformers_and_the_hook(
    tf_python: Path,
    attention_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    attention_hub.reset()
    daemon = make_daemon(hub_endpoint=attention_hub.url)
    env = {**hook_env(tmp_path, attention_hub, daemon), "PYTHONPATH": str(ROOT)}
    store = daemon.store_root.resolve()
    forms = [ATTENTION, f"{ATTENTION}@v1", f"{ATTENTION}:flash_attn_varlen_func"]
    args = {"model": str(tmp_path / "model"), "impls": forms, "set": [ATTENTION]}

    cold = _run(tf_python, args, env)
    assert cold["transformers"] == "5.25.0" and cold["kernels"] == "0.19.1" and cold["hooked"]
    for form in forms:
        _assert_served(cold["results"][form], store)
    _assert_served(cold["set"][ATTENTION], store)
    assert cold["kerneld_repos"] == [ATTENTION]
    assert attention_hub.counts["resolve_get"] > 0  # the daemon's download, once for the host

    attention_hub.reset_counts()
    warm = _run(tf_python, args, env)
    for form in forms:
        _assert_served(warm["results"][form], store)
    assert warm["kerneld_sources"] == ["index"] and warm["grpc"] is False
    assert attention_hub.total() == 0, dict(attention_hub.counts)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", ["hub", "torch", "error"])
def test_attention_kernel_failures_fail_the_load(
    policy: str,
    tf_python: Path,
    attention_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """Under every KERNELD_FALLBACK: a missing repo, a missing revision and an untrusted
    publisher fail `from_pretrained` with a ValueError naming the repo (Transformers wraps a
    missing repo or revision in one; kerneld's UntrustedPublisher is one); with the
    daemon stopped, a kernel the store holds still loads (the published index), one it lacks
    fails under `torch` and `error`, and under `hub` is downloaded in the job."""
    daemon = make_daemon(hub_endpoint=attention_hub.url)
    env = {
        **hook_env(tmp_path, attention_hub, daemon),
        "PYTHONPATH": str(ROOT),
        "KERNELD_FALLBACK": policy,
    }
    model = str(tmp_path / "model")
    bad = [f"{ORG}/absent", f"{ATTENTION}@no-such-branch", UNTRUSTED]
    out = _run(tf_python, {"model": model, "impls": [ATTENTION, *bad], "generate": False}, env)
    assert "error" not in out["results"][ATTENTION], out["results"][ATTENTION]
    for impl in bad:
        error = out["results"][impl].get("error")
        assert error is not None and error[2] is True, (impl, out["results"][impl])
        assert impl.split("@")[0] in error[1], error
    untrusted = out["results"][UNTRUSTED]["error"]
    assert untrusted[0] == "UntrustedPublisher" and "[trust] allow" in untrusted[1], untrusted
    print(policy, {impl: out["results"][impl]["error"][:2] for impl in bad})

    daemon.stop()
    # The stopped daemon's advert is gone: the job names the store itself (as a host whose
    # store path is configured does), and reads the published index.
    down = _run(
        tf_python,
        {"model": model, "impls": [ATTENTION, f"{ATTENTION}@v2"], "generate": False},
        {**env, "KERNELD_STORE": str(daemon.store_root)},
    )
    assert "error" not in down["results"][ATTENTION], down["results"][ATTENTION]
    lacking = down["results"][f"{ATTENTION}@v2"]
    if policy == "hub":
        assert "error" not in lacking and lacking["max_err"] < TOLERANCE, lacking
    else:
        assert lacking.get("error", ["", "", False])[2] is True, lacking
    print(policy, "daemon stopped, kernel not in the store:", lacking.get("error", "loaded"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_flash_attention_2_without_flash_attn_falls_back_to_the_hub_kernel(
    tf_python: Path,
    attention_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """`attn_implementation="flash_attention_2"` with flash-attn not installed: Transformers 5.25
    asks for `kernels-community/flash-attn2` v4 instead (on CPU too), and kerneld serves it."""
    daemon = make_daemon(hub_endpoint=attention_hub.url)
    env = {**hook_env(tmp_path, attention_hub, daemon), "PYTHONPATH": str(ROOT)}
    args = {"model": str(tmp_path / "model"), "impls": ["flash_attention_2"]}
    out = _run(tf_python, args, env)
    _assert_served(out["results"]["flash_attention_2"], daemon.store_root.resolve())
    assert out["kerneld_repos"] == [FLASH_ATTN2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_attention_kernel_through_the_endpoint_without_the_hook(
    tf_python: Path,
    attention_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """The same model with the hook off and `HF_ENDPOINT` the daemon's Hub API: `kernels`
    0.19.1 keeps its own copy in the job's HF cache (made from the store), the logits and
    generate() equal SDPA's, and a warm start sends the upstream Hub nothing."""
    attention_hub.reset()
    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=attention_hub.url)
    env = {
        **client_env(
            None,
            tmp_path,
            HF_ENDPOINT=endpoint,
            HF_HOME=str(tmp_path / "hf-home"),
            KERNELD_HOOK_KERNELS="0",
        ),
        "PYTHONPATH": str(ROOT),
    }
    args = {"model": str(tmp_path / "model"), "impls": [ATTENTION]}
    for name in ("cold", "warm"):
        attention_hub.reset_counts()
        out = _run(tf_python, args, env)
        assert out["hooked"] is False and out["kerneld_sources"] == []
        _assert_served(out["results"][ATTENTION], tmp_path / "hf-home")
        if name == "warm":
            assert attention_hub.total() == 0, dict(attention_hub.counts)
