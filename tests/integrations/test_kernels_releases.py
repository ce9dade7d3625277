"""The start-up hook with each `kernels` release it serves (0.17.2, 0.18.3, 0.19.1), each in a
clean venv holding only what pip resolves for `kernels==X` and kerneld-client (and torch, see
tests/hubapi/venvs.py): every public name is kerneld's and no private module is touched; a
cold load comes from the daemon, a warm one from the published index with no RPC and no Hub
request; a mapped layer is kernelized from the store; a mapped repo that is missing, and a
daemon that is down, keep the PyTorch layer with one KernelFallbackWarning naming the repo; a
misspelt revision and an untrusted publisher raise as in `kernels`. Beside it, every public
name's signature is compared with the release's own (inspect, in its venv). Transformers 5.22
and 5.25 through the hook: tests/integrations/test_transformers_releases.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import deps
from tests.hubapi.venvs import HOOK_RELEASES, run_in_venv
from tests.integrations.support import ACTIVATION, ORG, count_warnings, hook_env
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_kernels_child.py"
API_CHILD = HERE / "_kernels_api_child.py"
MISSING = f"{ORG}/no-such-kernel"


@pytest.fixture(scope="session")
def hook_venvs() -> dict[str, Path]:
    """Release -> the python of its clean venv with kerneld-client (`make test-deps` made
    them)."""
    return deps.hook_venvs()


def fallback_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": KernelFallbackWarning: " in line]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", HOOK_RELEASES)
def test_the_hook_serves_the_release(
    release: str,
    hook_venvs: dict[str, Path],
    hub: HubServer,
    hub_daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    python = hook_venvs[release]
    env = {k: v for k, v in hook_env(tmp_path, hub, hub_daemon).items() if k != "PYTHONPATH"}
    store = hub_daemon.store_root.resolve()

    cold = run_in_venv(python, CHILD, {"steps": [{"op": "get", "version": 1}]}, env)
    assert cold["version"] == release and cold["hooked"] is True
    assert cold["kerneld_in_private"] == []  # only `kernels`' public names are kerneld's
    (got,) = cold["steps"]
    assert got["ops_ok"] is True and got["kerneld_source"] == "daemon", got
    assert Path(got["file"]).is_relative_to(store)
    assert got["registry"][0][0] == ACTIVATION  # kernels.get_loaded_kernels() lists it

    hub.reset_counts()
    steps = [
        {"op": "get", "version": 1},
        {"op": "has", "version": 1},
        {"op": "kernelize", "version": 1},
        {"op": "kernelize", "repo": MISSING, "version": 1},
    ]
    warm = run_in_venv(python, CHILD, {"steps": steps}, env)
    got, has, mapped, missing = warm["steps"]
    assert got["kerneld_source"] == "index" and got["ops_ok"] is True, got
    assert has["value"] is True
    assert mapped.get("swapped") is True, mapped
    assert missing.get("swapped") is False, missing  # the PyTorch layer, no error
    warned = fallback_warnings(warm["stderr"])
    assert len(warned) == 1 and MISSING in warned[0], warm["stderr"]
    assert hub.counts["resolve_get"] == 0 and hub.counts.get("tree", 0) == 0, dict(hub.counts)

    # A misspelt revision can never be right: it raises, as in `kernels`.
    typo = run_in_venv(python, CHILD, {"steps": [{"op": "kernelize", "revision": "mian"}]}, env)
    assert typo["steps"][0].get("error") == "RevisionNotFound", typo["steps"]

    # The daemon is down and HF_ENDPOINT names nothing that answers: the mapped layer keeps
    # PyTorch, with one warning naming the repo and the reason.
    assert hub_daemon.stop() == 0
    down_env = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    down = run_in_venv(python, CHILD, {"steps": [{"op": "kernelize", "version": 2}]}, down_env)
    assert down["steps"][0].get("swapped") is False, down["steps"]
    warned = fallback_warnings(down["stderr"])
    assert len(warned) == 1 and ACTIVATION in warned[0], down["stderr"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_untrusted_publisher_still_raises(
    hook_venvs: dict[str, Path],
    hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    """A repo that exists and whose publisher is untrusted is a security decision, not an
    outage: `kernelize` raises (a ValueError, as `kernels`' refusal) instead of keeping PyTorch."""
    hub.set_trusted(ORG, False)
    daemon = make_daemon(hub_endpoint=hub.url, config={"trust": {"allow": []}})
    env = {k: v for k, v in hook_env(tmp_path, hub, daemon).items() if k != "PYTHONPATH"}
    out = run_in_venv(
        hook_venvs["0.19.1"], CHILD, {"steps": [{"op": "kernelize", "version": 1}]}, env
    )
    (step,) = out["steps"]
    assert step.get("error") == "UntrustedPublisher" and step["value_error"] is True, step
    assert count_warnings(out["stderr"], "KernelFallbackWarning") == 0


#: Where kerneld_client's names differ from `kernels`' on purpose (docs/kernels-compatibility.md
#: gives each reason): (name, what) -> the release it applies to, or "*".
ACCEPTED = {
    # kerneld_client's loaders read the caller's installed lock file without `lockfile=`
    ("load_kernel", "lockfile"): "*",
    ("get_locked_kernel", "lockfile"): "*",
    # `kernels`' LoadedKernel is a frozen dataclass built by its loader; kerneld's is built only
    # by kerneld_client, a slotted class that shows `dataclasses` kernels' fields (the warm path
    # does not import dataclasses)
    ("LoadedKernel", "init"): "*",
    # `kernels.Metadata` is a Rust class with no Python constructor; kerneld's is the parsed
    # JSON object (a dict) with the same attributes
    ("Metadata", "init"): "*",
}


def _compare(name: str, theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """What `ours` lacks or does differently from `theirs` (extra keyword-only parameters with
    defaults are allowed: kerneld's additions)."""
    if ours["kind"] != theirs["kind"]:
        return [f"{name}: a {ours['kind']}, kernels has a {theirs['kind']}"]
    if theirs["kind"] == "enum":
        lost = set(theirs["members"]) - set(ours["members"])
        return [f"{name}: no members {sorted(lost)}"] if lost else []
    problems = []
    if theirs["kind"] == "class":
        if theirs["dataclass"] and not ours["dataclass"] and (name, "init") not in ACCEPTED:
            problems.append(f"{name}: not a dataclass")
        lost = set(theirs["attributes"]) - set(ours["attributes"])
        if lost:
            problems.append(f"{name}: no attributes {sorted(lost)}")
        if (name, "init") in ACCEPTED:
            return problems
    if theirs.get("params") is None:
        return problems
    mine = {p[0]: p for p in ours["params"] or []}
    names = {p[0] for p in theirs["params"]}
    for param in theirs["params"]:
        got = mine.get(param[0])
        if got is None and param[1] == "VAR_POSITIONAL":
            got = next((p for p in mine.values() if p[1] == "VAR_POSITIONAL"), None)
        if got is not None and got[1] == param[1] and got[2] == param[2]:
            continue
        if (name, param[0]) in ACCEPTED:
            continue
        problems.append(f"{name}: parameter {param} is {got} here")
    for extra in ours["params"] or []:
        optional_keyword = extra[1] == "KEYWORD_ONLY" and extra[2] is not None
        if extra[0] not in names and not optional_keyword and extra[1] != "VAR_POSITIONAL":
            problems.append(f"{name}: extra parameter {extra}")
    return problems


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", HOOK_RELEASES)
def test_every_public_name_has_the_release_signature(
    release: str, hook_venvs: dict[str, Path], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELD_", "PYTHON", "HF_"))}
    env["HOME"] = str(tmp_path)
    out = run_in_venv(hook_venvs[release], API_CHILD, {}, env)
    assert out["version"] == release
    expected = {"0.17.2": 33, "0.18.3": 37, "0.19.1": 37}[release]  # __all__ less __version__
    assert len(out["names"]) == expected
    problems = [
        problem
        for name, both in sorted(out["names"].items())
        for problem in _compare(name, both["kernels"], both["kerneld"])
    ]
    assert problems == []
    # every accepted difference is in the release's table, with its reason
    from tests.client.test_kernels_names import documented

    listed = documented(f"kernels {release}")
    assert {name for name, _ in ACCEPTED} <= listed, listed
