"""`kerneldctl prefetch --store` (no daemon) against the test Hub: progress on a terminal, quiet
lines otherwise, JSON, and one failing kernel not hiding the others."""

from __future__ import annotations

import re
from pathlib import Path

from kerneld.store import Store
from tests.support.ctl import run_ctl, run_ctl_tty
from tests.support.hubserver import HubServer
from tests.support.lockhub import DEP_A, DEP_B, TOP, LockHub

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_prefetch_quiet_lines_json_and_partial_failure(
    tmp_path: Path, lock_hub: LockHub, lock_hub_server: HubServer
) -> None:
    store = tmp_path / "store"
    args = ("--store", str(store), "--hub-endpoint", lock_hub_server.url)
    r = run_ctl(
        "prefetch",
        *args,
        f"{DEP_B}:2",
        "kerneld-trusted/missing:1",
        f"{DEP_A}:2",
        "--variants",
        "all",
        home=tmp_path / "h",
    )
    assert r.rc == 1, r.stdout + r.stderr
    assert "\r" not in r.stdout and not ANSI.search(r.stdout)  # no bars in a log
    assert f"ok {DEP_B}@" in r.stdout and f"ok {DEP_A}@" in r.stdout
    assert "FAILED kerneld-trusted/missing" in r.stdout
    assert "2 kernel(s) ok, 1 failed" in r.stdout

    again = run_ctl(
        "prefetch",
        *args,
        f"{DEP_B}:2",
        "kerneld-trusted/missing:1",
        "--variants",
        "all",
        "--json",
        home=tmp_path / "h",
    )
    assert again.rc == 1
    doc = again.json()
    by_repo = {k["repo_id"]: k for k in doc["kernels"]}
    assert by_repo[DEP_B]["status"] == "ok"
    assert by_repo[DEP_B]["commit"] == lock_hub.commits[DEP_B]["v2"]
    assert by_repo[DEP_B]["variants"][0]["already_present"] is True
    assert by_repo["kerneld-trusted/missing"]["status"] == "failed"
    assert by_repo["kerneld-trusted/missing"]["error"]
    assert doc["kernels_ok"] == 1 and doc["kernels_failed"] == 1 and doc["ok"] is False
    with Store.open(store, read_only=True) as s:
        assert s.catalog.lookup(DEP_B, "v2", "torch-universal") is not None


def test_prefetch_progress_bar_on_a_terminal(
    tmp_path: Path, lock_hub: LockHub, lock_hub_server: HubServer
) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text(
        f'[tool.kernels.dependencies]\n"{TOP}" = 1\n'
    )
    r = run_ctl_tty(
        "prefetch",
        "--store",
        str(tmp_path / "store"),
        "--hub-endpoint",
        lock_hub_server.url,
        "--pyproject",
        str(tmp_path / "project"),
        home=tmp_path / "h",
    )
    assert r.rc == 0, r.stdout
    text = ANSI.sub("", r.stdout)
    assert "━" in text  # the bar
    assert re.search(r"\d+/\d+ files", text)  # files done / total
    assert re.search(r"\d+(\.\d+)? (kB|KB|KiB|bytes)", text)  # bytes done / total
    assert f"ok {TOP}@" in text
    # kernel-depends were followed: top's dependencies are in the store too
    with Store.open(tmp_path / "store", read_only=True) as s:
        fetched = s.catalog.variants(TOP, lock_hub.commits[TOP]["v1"])  # auto: what this host runs
        assert fetched
        if "torch-cpu" in fetched:  # depends on dep-b at a pinned commit
            assert s.catalog.variants(DEP_B, lock_hub.commits[DEP_B]["v1"])
        if "torch-universal" in fetched:  # depends on dep-a v1
            assert s.catalog.lookup(DEP_A, "v1", "torch-universal") is not None
