"""Plain `kernels` code served by kerneld through the start-up hook (KERNELD_HOOK_KERNELS=1,
`kernels`' public names bound to kerneld_client's): one daemon download, then warm process
starts that send nothing to the Hub; the lock-file loaders; an administrator's deny that
`kernels` cannot bypass; and the fallbacks when the daemon is gone. (With the project's
`kernels` 0.17.2; tests/integrations/test_kernels_releases.py runs 0.17.2, 0.18.3 and 0.19.1
in clean venvs.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from tests.integrations.support import ACTIVATION, ORG, count_warnings, hook_env, run_child
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

GET_V1 = {"op": "get", "version": 1}


def test_get_kernel_is_served_from_the_store(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    env = hook_env(tmp_path, hub, hub_daemon)
    cold = run_child("_kernels_child", {"steps": [GET_V1]}, env)
    assert cold["hooked"] is True
    (got,) = cold["steps"]
    assert got["ops_ok"] is True, got
    assert got["kerneld_source"] == "daemon"  # the index missed; the daemon fetched it
    store = hub_daemon.store_root.resolve()
    assert Path(got["file"]).is_relative_to(store)
    commit = got["registry"][0][1]
    assert got["registry"] == [[ACTIVATION, commit]]  # kernels.get_loaded_kernels() knows it
    assert hub.counts["resolve_get"] > 0  # the daemon's one download for this host

    # A second process start: the published index answers every loader, grpc is not even
    # imported, and the Hub hears nothing (plain `kernels` sends >= 3 requests here; see
    # test_daemon_down_falls_back_to_kernels for that control).
    lockfile = tmp_path / "kernels.lock"
    lock = [{"dependency": {"repo-id": ACTIVATION, "version": 1}, "lock": {"commit": commit}}]
    lockfile.write_text(json.dumps(lock))
    hub.reset_counts()
    steps = [
        GET_V1,
        {"op": "has", "version": 1},
        {"op": "load", "lockfile": str(lockfile)},
        {"op": "locked", "lockfile": str(lockfile)},
    ]
    warm = run_child("_kernels_child", {"steps": steps}, env)
    got, has, *locked = warm["steps"]
    assert has["value"] is True
    for loaded in (got, *locked):
        assert loaded["kerneld_source"] == "index" and loaded["ops_ok"] is True, loaded
        assert loaded["file"] == cold["steps"][0]["file"]
        assert loaded["registry"] == [[ACTIVATION, commit]]
    assert warm["grpc"] is False
    assert hub.total() == 0, dict(hub.counts)
    assert "Warning" not in warm["stderr"], warm["stderr"]


def test_a_denied_kernel_is_not_fetched_by_kernels(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    env = hook_env(tmp_path, hub, hub_daemon)
    with hub_daemon.admin() as admin:
        admin.Deny(pb.DenyRequest(repo_id=ACTIVATION, reason="advisory 7"), timeout=5)
    out = run_child("_kernels_child", {"steps": [GET_V1, {"op": "has", "version": 1}]}, env)
    got, has = out["steps"]
    assert got["error"] == "KernelDenied" and got["file_not_found"] is True
    assert "advisory 7" in got["message"]
    assert has["value"] is False
    assert hub.total() == 0, dict(hub.counts)  # nothing went around the deny

    # A layer mapped to the denied kernel keeps its PyTorch forward: one warning, the reason.
    out = run_child("_kernels_child", {"steps": [{"op": "kernelize", "version": 1}]}, env)
    assert out["steps"][0].get("swapped") is False, out["steps"]
    warned = [x for x in out["stderr"].splitlines() if ": KernelFallbackWarning: " in x]
    assert len(warned) == 1 and ACTIVATION in warned[0] and "advisory 7" in warned[0], warned
    assert hub.total() == 0, dict(hub.counts)


@pytest.mark.slow
def test_daemon_down_falls_back_to_kernels(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The hook's default policy is `hub` (what `kernels` would do): a verified in-process
    download from HF_ENDPOINT, with one KernelFallbackWarning; `torch` asks no Hub at all."""
    env = hook_env(tmp_path, hub, hub_daemon)
    assert hub_daemon.stop() == 0
    out = run_child("_kernels_child", {"steps": [GET_V1, GET_V1]}, env)
    assert out["hooked"] is True
    for got in out["steps"]:
        assert got["ops_ok"] is True and got["kerneld_source"] == "hub", got
    assert hub.counts["resolve_get"] > 0
    assert count_warnings(out["stderr"], "KernelFallbackWarning") == 1, out["stderr"]

    # The control: with the hook off, a warm start of plain `kernels` asks the Hub again.
    hub.reset_counts()
    plain = run_child("_kernels_child", {"steps": [GET_V1]}, {**env, "KERNELD_HOOK_KERNELS": "0"})
    assert plain["hooked"] is False and plain["steps"][0]["ops_ok"] is True
    assert hub.total() >= 3, dict(hub.counts)

    # KERNELD_FALLBACK=torch: no Hub at all; the typed error (kernelize keeps PyTorch on it).
    hub.reset_counts()
    out = run_child("_kernels_child", {"steps": [GET_V1]}, {**env, "KERNELD_FALLBACK": "torch"})
    (got,) = out["steps"]
    assert got["error"] == "DaemonUnavailable", got
    assert hub.total() == 0, dict(hub.counts)


def test_an_untrusted_publisher_is_refused_as_kernels_refuses_it(
    hub: HubServer, make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """With the hook on, `trust_remote_code=False` still refuses a publisher the Hub does not
    trust, with a ValueError as `kernels` raises (UntrustedPublisher; the daemon checks, with
    the call's trust_remote_code); `trust_remote_code=True` loads it through kerneld."""
    hub.set_trusted(ORG, False)
    daemon = make_daemon(hub_endpoint=hub.url, config={"trust": {"allow": []}})
    env = hook_env(tmp_path, hub, daemon)
    steps = [GET_V1, {**GET_V1, "trust_remote_code": True}]
    refused, trusted = run_child("_kernels_child", {"steps": steps}, env)["steps"]
    assert refused["error"] == "UntrustedPublisher" and refused["value_error"], refused
    assert "not from a trusted publisher" in refused["message"]
    assert "trust_remote_code" in refused["message"]
    assert trusted.get("kerneld_source") == "daemon" and trusted["ops_ok"] is True, trusted
    assert hub.counts["org_overview"] == 1  # the daemon asked once; nothing else did


def test_a_version_the_repo_does_not_have_is_kernels_own_value_error(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A mapping naming a version that does not exist can never be right: with the hook, as
    without it, `kernels` raises its ValueError ("Version N not found, available versions")
    instead of keeping the PyTorch forward; the list comes from the daemon."""
    env = hook_env(tmp_path, hub, hub_daemon)
    steps = [{"op": "kernelize", "version": 9}, {"op": "get", "version": 9}]
    out = run_child("_kernels_child", {"steps": steps}, env)
    for result in out["steps"]:
        assert result.get("value_error") is True, result
        assert "Version 9 not found, available versions: 1, 2" in result["message"], result
        assert result["message"].count(f"{ACTIVATION}@v9") <= 1, result
    assert count_warnings(out["stderr"], "KernelFallbackWarning") == 0, out["stderr"]


def test_an_older_version_gets_kernels_notice(
    hub: HubServer, hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """`kernels` notes "You are using version 1 of ..., but version 2 is available" on its
    `kernels._versions` logger; with the hook the daemon's refs listing (published in the
    index) says the same, cold and warm, and nothing for the newest version."""
    env = hook_env(tmp_path, hub, hub_daemon)
    notice = f"You are using version 1 of '{ACTIVATION}', but version 2 is available."
    for _ in ("cold", "warm"):
        out = run_child("_kernels_child", {"steps": [GET_V1, {"op": "get", "version": 2}]}, env)
        assert all(step.get("ops_ok") for step in out["steps"]), out["steps"]
        assert out["stderr"].count(notice) == 1, out["stderr"]
        assert "You are using version 2" not in out["stderr"]


@pytest.mark.parametrize("status", [503, 401])
def test_an_org_that_cannot_be_checked_keeps_pytorch(
    status: int, hub: HubServer, make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Issue 40 §4: the Hub's org overview fails (an outage, or a token it refuses), so nobody
    can say whether the publisher is trusted. That is not a verdict: a mapped layer keeps its
    PyTorch forward with one KernelFallbackWarning naming the repo and the reason, whether the
    daemon asks (it is up) or the client's own Hub fallback does (the daemon is down)."""
    hub.inject(Fault("/api/organizations/*/overview", "error", status=status))
    # no site allow-list: the Hub's trusted-publisher check is the only word on the org
    daemon = make_daemon(hub_endpoint=hub.url, config={"trust": {"allow": []}})
    env = hook_env(tmp_path, hub, daemon)
    step = {"op": "kernelize", "version": 1}
    up = run_child("_kernels_child", {"steps": [step]}, env)
    assert up["steps"][0].get("swapped") is False, up["steps"]
    warned = [x for x in up["stderr"].splitlines() if ": KernelFallbackWarning: " in x]
    assert len(warned) == 1, up["stderr"]
    assert ACTIVATION in warned[0] and "could not verify" in warned[0], warned
    assert str(status) in warned[0], warned
    assert hub.counts["org_overview"] >= 1 and hub.counts["resolve_get"] == 0, dict(hub.counts)

    assert daemon.stop() == 0
    hub.reset_counts()
    down = run_child("_kernels_child", {"steps": [step]}, env)
    assert down["steps"][0].get("swapped") is False, down["steps"]
    warned = [x for x in down["stderr"].splitlines() if ": KernelFallbackWarning: " in x]
    assert len(warned) == 1, down["stderr"]
    assert ACTIVATION in warned[0] and "could not verify" in warned[0], warned
    assert hub.counts["org_overview"] >= 1 and hub.counts["resolve_get"] == 0, dict(hub.counts)
