"""The published index's picks: each client platform's variant per commit, rewritten for every
repo when the set of platforms changes, and kept as they are across a restart."""

from __future__ import annotations

import json
from pathlib import Path

from kerneld.store import Store
from kerneld_client.variants import Backend, BackendType, PlatformFacts, fingerprint
from tests.store.conftest import COMMIT_A, publish

CPU213 = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)
CUDA = PlatformFacts(
    cpu="x86_64",
    os="linux",
    torch_version=(2, 13),
    cxx11_abi=True,
    backend=Backend(BackendType.CUDA, (13, 0)),
    device_capabilities=("9.0",),
)
REPOS = [f"org/kernel{i}" for i in range(7)]  # more than one batch of a republish


def _picks(root: Path, repo: str) -> dict[str, str | None]:
    org, name = repo.split("/")
    doc = json.loads((root / "index" / "v1" / org / f"{name}.json").read_text())
    picks: dict[str, str | None] = doc["commits"][COMMIT_A].get("picks", {})
    return picks


def test_new_platforms_rewrite_every_repo_and_a_restart_keeps_them(store_root: Path) -> None:
    with Store.open(store_root, min_age_s=0) as store:
        for i, repo in enumerate(REPOS):
            publish(store, repo, variant="torch-cpu", kid=f"_k{i}_cpu")
            publish(store, repo, variant="torch-universal", kid=f"_k{i}_universal")
        store.names.set_upstream_variants(REPOS[0], COMMIT_A, ["torch-cpu", "torch-cuda"])
        assert _picks(store_root, REPOS[-1]) == {}  # no platform shown yet: no picks
        store.published.set_platforms([CPU213, CUDA])
        cpu, cuda = fingerprint(CPU213.to_dict()), fingerprint(CUDA.to_dict())
        for repo in REPOS[1:]:
            assert _picks(store_root, repo) == {cpu: "torch-cpu", cuda: "torch-universal"}
        # Known upstream variants decide: the CUDA platform's pick is not fetched yet.
        assert _picks(store_root, REPOS[0]) == {cpu: "torch-cpu", cuda: "torch-cuda"}
        generation = store.published.generation
        store.published.set_platforms([CUDA, CPU213])  # the same set: nothing to rewrite
        assert store.published.generation == generation
    path = store_root / "index" / "v1" / "org" / "kernel5.json"
    before = path.stat().st_mtime_ns
    Store.open(store_root, min_age_s=0, client_platforms=[CPU213, CUDA]).close()
    assert path.stat().st_mtime_ns == before  # the same picks: the restart rewrote nothing
    Store.open(store_root, min_age_s=0).close()  # opened without platforms: picks dropped
    assert _picks(store_root, REPOS[5]) == {}
