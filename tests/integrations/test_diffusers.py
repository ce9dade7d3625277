"""Diffusers 0.42.1's Hub attention backends through kerneld (issue 53), in a clean venv with
Diffusers, `kernels` 0.19.1 and kerneld-client's start-up hook.

Diffusers asks the Hub whether a backend's publisher is trusted before `get_kernel`; under the
hook that question is kerneld's (client/kerneld_client/integrations/diffusers.py). The example
attention kernel (examples/kernels/attention: flash-attn 2 and 3's and SageAttention's
interfaces on CPU) stands in for the four repos the six backends load, under their names and
version branches. A warm process sends the Hub nothing and works with the Hub gone; an untrusted
publisher is refused, with DIFFUSERS_TRUST_REMOTE_KERNELS=true too, unless the site's
`[trust] allow` lists it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from tests import deps
from tests.integrations.support import ROOT, hook_env
from tests.integrations.test_transformers_releases import run_models
from tests.support.daemon import DEFAULT_CONFIG, DaemonProcess
from tests.support.hubserver import HubServer

#: Backend -> the repo and version branch Diffusers 0.42.1 loads it from (_HUB_KERNELS_REGISTRY).
BACKENDS = {
    "flash_hub": ("kernels-community/flash-attn2", 3),
    "flash_varlen_hub": ("kernels-community/flash-attn2", 3),
    "_flash_3_hub": ("kernels-community/flash-attn3", 1),
    "_flash_3_varlen_hub": ("kernels-community/flash-attn3", 1),
    "sage_hub": ("SageAttention/sage-attention", 3),
    "flash_4_hub": ("kernels-community/flash-attn4", 0),
}
SAGE = "SageAttention/sage-attention"
TOLERANCE = 1e-5
CHILD = "tests.integrations._diffusers_child"


@pytest.fixture(scope="module")
def diffusers_python() -> Path:
    """Diffusers' venv with `kernels` and kerneld-client (`make test-deps` made it)."""
    return deps.diffusers_venv()


@pytest.fixture
def diffusers_hub(example_hub: HubRoot, tmp_path: Path) -> Iterator[HubServer]:
    """The example attention repo under each repo name the backends load, with the version
    branch they ask for made from its v1; the Hub trusts kernels-community, not SageAttention."""
    source = example_hub.root / "kernels" / ORG / "attention"
    for repo, version in set(BACKENDS.values()):
        dest = tmp_path / "hub" / "kernels" / repo
        shutil.copytree(source, dest, symlinks=True)
        if version != 1:
            git = ["git", "-C", str(dest), "branch", f"v{version}", "v1"]
            subprocess.run(git, check=True, capture_output=True)
    trusted = {"kernels-community": True, "SageAttention": False}
    # Case-insensitive as the Hub's organisation names are (the daemon asks about `sageattention`)
    with HubServer(tmp_path / "hub", trusted_orgs=trusted, case_insensitive=True) as server:
        yield server


def _run(python: Path, env: dict[str, str], backends: list[str]) -> dict[str, Any]:
    out = run_models(python, {"backends": backends}, env, child=CHILD)
    assert out["diffusers"] == "0.42.1" and out["kernels"] == "0.19.1", out
    assert out["hooked"] and out["attached"], out
    return out


def _assert_served(out: dict[str, Any], backend: str, store: Path) -> None:
    result = out["results"][backend]
    assert "error" not in result, (backend, result)
    assert result["max_err"] < TOLERANCE, (backend, result)
    assert Path(result["file"]).is_relative_to(store), (backend, result)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hub_backends_warm_make_no_hub_request_and_run_with_the_hub_down(
    diffusers_python: Path,
    diffusers_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """All six backends equal the native one, from the store: cold (the daemon downloads), warm
    (no Hub request, Diffusers' publisher question included), with the Hub gone. The flash
    repos' publisher is trusted by the Hub's verdict, SageAttention's only by this site's
    `[trust] allow` (the Hub says no): a site's allow-list overrules the Hub, as documented."""
    site_allow = [*DEFAULT_CONFIG["trust"]["allow"], SAGE]
    daemon = make_daemon(hub_endpoint=diffusers_hub.url, config={"trust": {"allow": site_allow}})
    env = {**hook_env(tmp_path, diffusers_hub, daemon), "PYTHONPATH": str(ROOT)}
    store = daemon.store_root.resolve()
    backends = list(BACKENDS)

    cold = _run(diffusers_python, env, backends)
    for backend in backends:
        _assert_served(cold, backend, store)
    assert cold["kerneld_sources"] == ["daemon"] and cold["warnings"] == [], cold
    assert diffusers_hub.counts["resolve_get"] > 0  # the daemon's download, once for the host

    diffusers_hub.reset_counts()
    warm = _run(diffusers_python, env, backends)
    for backend in backends:
        _assert_served(warm, backend, store)
    assert warm["kerneld_sources"] == ["index"] and warm["grpc"] is False, warm
    assert diffusers_hub.total() == 0, dict(diffusers_hub.counts)  # Diffusers' check included

    diffusers_hub.stop()  # the Hub is unreachable now, for the job and the daemon alike
    down = _run(diffusers_python, env, backends)
    for backend in backends:
        _assert_served(down, backend, store)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_untrusted_publisher_is_refused_whatever_diffusers_is_told(
    diffusers_python: Path,
    diffusers_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """SageAttention untrusted by the Hub and not allowed by the site: `sage_hub` is refused,
    with DIFFUSERS_TRUST_REMOTE_KERNELS=true too (which Diffusers alone turns into skipping its
    check and `trust_remote_code=True`), while the trusted backend loads. (Without the variable
    a hooked process takes the same path: the hook has set Diffusers' copy of it to False, so
    Diffusers asks kerneld's overview and calls kerneld's `get_kernel` without
    trust_remote_code; the site that allows the repo is the test above.)"""
    daemon = make_daemon(hub_endpoint=diffusers_hub.url)
    env = {**hook_env(tmp_path, diffusers_hub, daemon), "PYTHONPATH": str(ROOT)}
    out = _run(
        diffusers_python,
        {**env, "DIFFUSERS_TRUST_REMOTE_KERNELS": "true"},
        ["sage_hub", "flash_hub"],
    )
    error = out["results"]["sage_hub"].get("error")
    assert error is not None and error[0] == "UntrustedPublisher", out
    assert SAGE in error[1] and "[trust] allow" in error[1], error
    _assert_served(out, "flash_hub", daemon.store_root.resolve())
    assert out["trust_env"] is False
    said = [*out["warnings"], *out["stderr"].splitlines()]  # caught, or printed if earlier
    ignored = [w for w in said if "KerneldHookWarning" in w and "DIFFUSERS_TRUST" in w]
    assert len(ignored) == 1, said
    print(f"DIFFUSERS_TRUST_REMOTE_KERNELS=true: sage_hub refused: {error[1]}")
