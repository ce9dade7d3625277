"""`kerneldctl lock` against the real `kernels lock` on the same project and the same Hub server,
and `--verify-old` against the Hub and a store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kerneld.pipeline.fetch import Fetcher
from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.store import Store
from kerneld.upstream.hub import HubUpstream
from kerneld_client.lockfile import parse_lockfile
from tests.support.ctl import ctl_env, run_ctl
from tests.support.hubserver import HubServer
from tests.support.lockhub import DEP_A, DEP_B, TOP, LockHub, old_hash

PYPROJECT = f"""\
[project]
name = "demo"
version = "0.1.0"

[tool.kernels.dependencies]
"{TOP}" = 1
"{DEP_A}" = 2
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "pyproject.toml").write_text(PYPROJECT)
    return p


@pytest.fixture(scope="module")
def filled_store(
    tmp_path_factory: pytest.TempPathFactory, lock_hub: LockHub, lock_hub_server: HubServer
) -> Path:
    """Every variant of every commit the project locks, fetched from the Hub into a store."""
    root = tmp_path_factory.mktemp("lock-store") / "store"
    with Store.open(root) as store:
        hub = HubUpstream(endpoint=lock_hub_server.url, token=False)
        fetcher = Fetcher(store, [hub])
        resolver = Resolver(store, [hub], fetch=fetcher)
        for repo, version in ((TOP, 1), (DEP_A, 1), (DEP_A, 2), (DEP_B, 2)):
            commit, _ = resolver.commit_for(KernelSpec(repo, version=version))
            for variant in resolver.variant_names(repo, commit):
                if variant != "docs":
                    fetcher.fetch_variant(repo, commit, variant)
        commit = lock_hub.commits[DEP_B]["v1"]
        fetcher.fetch_variant(DEP_B, commit, "torch-universal")
    return root


@pytest.fixture(scope="module")
def kernels_lock_bytes(
    tmp_path_factory: pytest.TempPathFactory, lock_hub_server: HubServer
) -> bytes:
    """What the real `kernels lock` CLI of this venv writes for the project, with the test Hub
    as its endpoint (HF_ENDPOINT, as huggingface_hub reads it)."""
    base = tmp_path_factory.mktemp("kernels-lock")
    theirs = base / "project"
    theirs.mkdir()
    (theirs / "pyproject.toml").write_text(PYPROJECT)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kernels")), "lock", str(theirs)],
        capture_output=True,
        text=True,
        env=ctl_env(base / "home", {"HF_ENDPOINT": lock_hub_server.url}),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return (theirs / "kernels.lock").read_bytes()


def test_lock_is_byte_identical_to_kernels_lock(
    tmp_path: Path,
    project: Path,
    lock_hub: LockHub,
    lock_hub_server: HubServer,
    kernels_lock_bytes: bytes,
) -> None:
    r = run_ctl(
        "lock",
        str(project),
        "--json",
        home=tmp_path / "home",
        env={"HF_ENDPOINT": lock_hub_server.url},
    )
    assert r.rc == 0, r.stderr
    assert (project / "kernels.lock").read_bytes() == kernels_lock_bytes
    doc = r.json()
    assert doc["written"] and doc["changed"] and doc["source"] == "hub"

    locks = parse_lockfile(kernels_lock_bytes).locks
    got = {(x.dependency.repo_id, x.dependency.ref): x.commit for x in locks}
    c = lock_hub.commits
    assert got == {
        (TOP, "v1"): c[TOP]["v1"],
        (DEP_A, "v1"): c[DEP_A]["v1"],  # through top's torch-universal
        (DEP_A, "v2"): c[DEP_A]["v2"],
        (DEP_B, "v2"): c[DEP_B]["v2"],  # through dep-a v1
        (DEP_B, c[DEP_B]["v1"]): c[DEP_B]["v1"],  # top's torch-cpu pins a commit
    }
    assert [x["repo_id"] for x in doc["locks"]] == [x.dependency.repo_id for x in locks]

    # --hub-endpoint works without HF_ENDPOINT; --check reports a stale file and writes nothing
    (project / "kernels.lock").write_text("[]")
    stale = run_ctl(
        "lock",
        str(project),
        "--check",
        "--hub-endpoint",
        lock_hub_server.url,
        home=tmp_path / "home",
    )
    assert stale.rc == 1 and "OUT OF DATE" in stale.stdout
    assert (project / "kernels.lock").read_text() == "[]"


def test_lock_from_a_store_matches_kernels_lock(
    tmp_path: Path, project: Path, filled_store: Path, kernels_lock_bytes: bytes
) -> None:
    no_hub = {"HF_ENDPOINT": "http://127.0.0.1:9"}
    offline = run_ctl(
        "lock",
        str(project),
        "--store",
        str(filled_store),
        "--json",
        home=tmp_path / "home",
        env=no_hub,
    )
    assert offline.rc == 0, offline.stderr
    assert offline.json()["source"] == "store"
    assert (project / "kernels.lock").read_bytes() == kernels_lock_bytes
    check = run_ctl(
        "lock",
        str(project),
        "--check",
        "--store",
        str(filled_store),
        home=tmp_path / "home",
        env=no_hub,
    )
    assert check.rc == 0 and "up to date" in check.stdout


def test_lock_errors(tmp_path: Path, project: Path, lock_hub_server: HubServer) -> None:
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{TOP}" = 9\n')
    r = run_ctl("lock", str(project), "--hub-endpoint", lock_hub_server.url, home=tmp_path / "h")
    assert r.rc == 1 and "version 9 not found, available versions: 1, 2" in r.stderr
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    r = run_ctl("lock", str(project), "--hub-endpoint", lock_hub_server.url, home=tmp_path / "h")
    assert r.rc == 1 and "no [tool.kernels.dependencies]" in r.stderr
    assert not (project / "kernels.lock").exists()


def _old_lock(lock_hub: LockHub, path: Path, *, tamper: bool = False) -> None:
    entries = []
    for repo, ref, variants in (
        (TOP, "v1", ("torch-universal", "torch-cpu")),
        (DEP_B, "v2", ("torch-universal",)),
    ):
        commit = lock_hub.commits[repo][ref]
        files = lock_hub.files[(repo, commit)]
        hashes = {v: old_hash(files, v, lock_hub.lfs) for v in variants}
        entries.append(
            {
                "repo_id": repo,
                "sha": commit,
                "variants": {
                    v: {"hash": h, "hash_type": "git_lfs_concat"} for v, h in hashes.items()
                },
            }
        )
    if tamper:
        entries[0]["variants"]["torch-cpu"]["hash"] = "sha256-" + "0" * 64  # type: ignore[index]
    path.write_text(json.dumps(entries, indent=2))


def test_verify_old_against_hub_and_store(
    tmp_path: Path, lock_hub: LockHub, lock_hub_server: HubServer, filled_store: Path
) -> None:
    good, bad = tmp_path / "good.lock", tmp_path / "bad.lock"
    _old_lock(lock_hub, good)
    _old_lock(lock_hub, bad, tamper=True)
    hub = ("--hub-endpoint", lock_hub_server.url)
    r = run_ctl("lock", "--verify-old", str(good), *hub, "--json", home=tmp_path / "h")
    assert r.rc == 0, r.stdout + r.stderr
    assert [x["status"] for x in r.json()["results"]] == ["ok", "ok", "ok"]
    r = run_ctl("lock", "--verify-old", str(bad), *hub, home=tmp_path / "h")
    assert r.rc == 1 and "MISMATCH" in r.stdout and "torch-cpu" in r.stdout

    store = ("--store", str(filled_store))
    r = run_ctl("lock", "--verify-old", str(good), *store, "--json", home=tmp_path / "h")
    assert r.rc == 0, r.stdout + r.stderr
    assert r.json()["source"] == "store"
    assert {x["status"] for x in r.json()["results"]} == {"ok"}
    r = run_ctl("lock", "--verify-old", str(bad), *store, "--json", home=tmp_path / "h")
    assert r.rc == 1
    assert [x["variant"] for x in r.json()["results"] if x["status"] == "mismatch"] == ["torch-cpu"]

    new_format = tmp_path / "kernels.lock"
    new_format.write_text("[]")
    r = run_ctl("lock", "--verify-old", str(new_format), *hub, home=tmp_path / "h")
    assert r.rc == 2 and "carries no content hashes" in r.stderr
