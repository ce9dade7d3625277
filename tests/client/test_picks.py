"""A warm load takes the daemon's published pick for its platform fingerprint and ranks
nothing; a platform without a pick ranks for itself (and imports the variant rules to)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from examples.kernels.built import BuiltExamples
from kerneld.store import Store
from kerneld.store.published_index import atomic_write_json
from kerneld_client.variants import fingerprint
from tests.client.support import ACTIVATION, Populated, client_env, local_facts, run_client

LOAD = """
import json, sys
import kerneld_client
try:
    mod = kerneld_client.get_kernel("kerneld-examples/activation", version=1, policy="error")
    info = kerneld_client.loaded_kernels()[0]
    out = {"variant": info.variant, "source": info.source}
except kerneld_client.KernelError as exc:
    out = {"error": type(exc).__name__}
out["ranked"] = "kerneld_client.variants.choice" in sys.modules
out["rules"] = sorted(m for m in sys.modules if m.startswith("kerneld_client.variants."))
print(json.dumps(out))
"""


def _doc_path(store: Path) -> Path:
    org, name = ACTIVATION.split("/")
    return store / "index" / "v1" / org / f"{name}.json"


def _with_picks(populated: Populated) -> tuple[dict[str, Any], str, str]:
    """Open the store as the daemon does, with this machine's platform as a client platform:
    the index it republishes carries that platform's picks. (document, commit, fingerprint)"""
    Store.open(populated.root, client_platforms=[local_facts()]).close()
    doc = json.loads(_doc_path(populated.root).read_text())
    commit = populated.commits[(ACTIVATION, "v1")]
    return doc, commit, fingerprint(local_facts().to_dict())


def test_the_pick_is_loaded_and_nothing_is_ranked(
    fresh_store: Populated, built_examples: BuiltExamples, tmp_path: Path
) -> None:
    doc, commit, key = _with_picks(fresh_store)
    assert doc["commits"][commit]["picks"] == {key: built_examples.arch_variant}
    out = run_client(LOAD, client_env(fresh_store.root, tmp_path))
    assert (out["variant"], out["source"]) == (built_examples.arch_variant, "index")
    assert out["rules"] == [
        "kerneld_client.variants.fingerprints",
        "kerneld_client.variants.versions",
    ]


def test_the_client_follows_the_pick(fresh_store: Populated, tmp_path: Path) -> None:
    """The pick decides, not a ranking of the client's own: published `torch-cpu` is loaded,
    and a pick that is not in the store sends the load to the daemon (none here)."""
    doc, commit, key = _with_picks(fresh_store)
    doc["commits"][commit]["picks"][key] = "torch-cpu"
    atomic_write_json(_doc_path(fresh_store.root), doc)
    out = run_client(LOAD, client_env(fresh_store.root, tmp_path))
    assert (out["variant"], out["ranked"]) == ("torch-cpu", False)
    doc["commits"][commit]["picks"][key] = "torch213-cxx11-cu130-x86_64-linux"
    atomic_write_json(_doc_path(fresh_store.root), doc)
    out = run_client(LOAD, client_env(fresh_store.root, tmp_path))
    assert out["error"] == "DaemonUnavailable"


def test_a_platform_without_a_pick_ranks_for_itself(
    fresh_store: Populated, built_examples: BuiltExamples, tmp_path: Path
) -> None:
    _with_picks(fresh_store)
    other = {**local_facts().to_dict(), "tvm_ffi_version": "0.1"}  # another fingerprint
    env = client_env(fresh_store.root, tmp_path, KERNELD_PLATFORM_JSON=json.dumps(other))
    out = run_client(LOAD, env)
    assert (out["variant"], out["ranked"]) == (built_examples.arch_variant, True)
