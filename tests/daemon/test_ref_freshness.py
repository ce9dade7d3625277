"""A moved `v1` reaches jobs (issue 18, §1): the daemon re-checks every served ref once its TTL
is up, in the background; it fetches a new commit and moves the published index only when the
tree is in; a stale ref is one the upstreams failed to re-check, and only that is counted.

Real daemon (as its own user), real Hub test server over a git repo whose `v1` branch the test
moves, real client processes loading warm from the published index."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, http_get_unix, metric
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.gitrepo import GitRepo, kernel_variant_files
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

ORG = "kerneld-fresh"
REPO = f"{ORG}/scale"
TTL = 2.0

LOAD = """
import json, torch, kerneld_client
mod = kerneld_client.get_kernel({repo!r}, version=1, policy="error")
print(json.dumps({{"version": mod.VERSION, "file": mod.__file__}}))
"""


def _build(repo: GitRepo, version: int) -> str:
    files = kernel_variant_files(name="scale", version=version, factor=float(version))
    repo.commit(f"build {version}", files)
    return repo.branch("v1", force=True)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[HubServer, GitRepo]]:
    repo = GitRepo(tmp_path / "hub" / "kernels" / ORG / "scale", lfs=True)
    repo.lfs_track("*.bin")
    _build(repo, 1)
    with HubServer(tmp_path / "hub", trusted_orgs={ORG: True}) as server:
        yield server, repo


def _load(d: DaemonProcess, tmp: Path, **extra: str) -> int:
    env = client_env(d.store_root, tmp, KERNELD_SOCKET=str(d.user_socket), **extra)
    return int(run_client(LOAD.format(repo=REPO), env)["version"])


def _wait(check: Callable[[], bool], d: DaemonProcess, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, d.logs()[-4000:]
        time.sleep(0.1)
    return time.monotonic() - start


def _index_commit(d: DaemonProcess) -> str:
    with d.admin() as admin:
        refs = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT).refs
    return next(r.commit for r in refs if r.repo_id == REPO and r.ref == "v1")


@pytest.mark.slow
def test_a_moved_version_branch_reaches_new_jobs_within_the_ttl(
    make_daemon: Callable[..., DaemonProcess],
    hub: tuple[HubServer, GitRepo],
    tmp_path: Path,
) -> None:
    server, repo = hub
    metrics_sock = daemon_dir("kd-m-") / "metrics.sock"
    d = make_daemon(
        hub_endpoint=server.url,
        config={
            "resolve": {"ref_ttl": TTL},
            "fetch": {"attempts": 1},
            "metrics": {"socket": str(metrics_sock)},
        },
    )
    assert _load(d, tmp_path) == 1  # cold: fetched through the daemon
    first = _index_commit(d)
    # The author moves v1 to a new build.
    pushed_at = time.monotonic()
    second = _build(repo, 2)
    assert second != first
    # The daemon notices by itself (no job asks it: warm loads read the index) ...
    _wait(lambda: _index_commit(d) == second, d, timeout=TTL + 15)
    moved_after = time.monotonic() - pushed_at
    # ... and a new process loads the new build warm.
    assert _load(d, tmp_path) == 2
    assert moved_after < TTL + 10, moved_after
    logs = d.logs()
    assert f"ref moved repo={REPO} ref=v1 from={first} to={second}" in logs
    text = http_get_unix(metrics_sock)
    assert metric(text, "kerneld_ref_rechecks_total", outcome="moved") >= 1
    # Nothing failed, so nothing was stale, although refs went past their TTL all the time.
    assert metric(text, "kerneld_stale_serves_total") == 0
    assert "serving stale ref" not in logs

    # The Hub goes down and v1 moves again: jobs keep the commit they had, now stale (asked
    # for, a job that re-checks refs older than the TTL gets it flagged and counted).
    server.inject(Fault("*", "error", status=503))
    _build(repo, 3)
    _wait(
        lambda: (
            metric(http_get_unix(metrics_sock), "kerneld_ref_rechecks_total", outcome="failed") >= 1
        ),
        d,
        timeout=TTL + 15,
    )
    assert _load(d, tmp_path, KERNELD_REF_MAX_AGE=f"{TTL:g}") == 2
    assert _index_commit(d) == second
    text = http_get_unix(metrics_sock)
    assert metric(text, "kerneld_stale_serves_total") >= 1
    with d.admin() as admin:
        refs = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT).refs
    assert any(r.repo_id == REPO and r.ref == "v1" and r.stale for r in refs)

    # The outage goes on: re-checks keep failing every TTL, but the log has one warning for
    # it (issue 51: not a line per ref per retry) ...
    _wait(
        lambda: (
            metric(http_get_unix(metrics_sock), "kerneld_ref_rechecks_total", outcome="failed") >= 3
        ),
        d,
        timeout=3 * TTL + 20,
    )
    warnings = [x for x in d.logs().splitlines() if " WARNING " in x]
    assert len([x for x in warnings if "ref re-check failed" in x]) == 1, warnings
    assert len([x for x in warnings if "serving stale ref" in x]) == 1, warnings
    # ... and one line when the upstream answers again (v1 then moves to the third build).
    server.clear_faults()
    third = repo.rev_parse("refs/heads/v1")
    _wait(lambda: _index_commit(d) == third, d, timeout=TTL + 20)
    logs = d.logs()
    assert logs.count("ref re-checks answered again") == 1, logs[-3000:]
    assert logs.count("upstreams answer again") == 1, logs[-3000:]
