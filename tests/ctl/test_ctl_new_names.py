"""`kerneldctl` with builds as `kernels` 0.19 publishes them (the example kernel relu2-next: a
variant under the new name format, and a zip build): prefetch fetches them, ls and info show
them, and `--variants` takes the new names."""

from __future__ import annotations

from pathlib import Path

from examples.kernels.built import BuiltExamples
from examples.kernels.specs import ORG
from kerneld.store import Store
from tests.support.ctl import run_ctl
from tests.support.hubserver import HubServer

NEXT = f"{ORG}/relu2-next"


def test_prefetch_ls_and_info_of_new_format_builds(
    tmp_path: Path, example_hub_server: HubServer, built_examples: BuiltExamples
) -> None:
    store = tmp_path / "store"
    args = ("--store", str(store), "--hub-endpoint", example_hub_server.url)
    home = tmp_path / "h"
    name = built_examples.variant("relu2-next", 1).variant
    for version in (1, 2):
        r = run_ctl("prefetch", *args, f"{NEXT}:{version}", "--json", home=home)
        assert r.rc == 0, r.stdout + r.stderr
        doc = r.json()
        assert doc["kernels_ok"] == 1 and doc["ok"] is True
        (kernel,) = doc["kernels"]
        assert [v["variant"] for v in kernel["variants"]] == [name], kernel
    with Store.open(store, read_only=True) as s:
        assert s.catalog.lookup(NEXT, "v1", name) is not None
        assert s.catalog.lookup(NEXT, "v2", name) is not None

    # The new name is taken as it is by --variants.
    again = run_ctl("prefetch", *args, f"{NEXT}:2", "--variants", name, "--json", home=home)
    assert again.rc == 0 and again.json()["kernels"][0]["variants"][0]["already_present"]

    listed = run_ctl("ls", "--store", str(store), "--json", home=home).json()
    (kernel,) = [k for k in listed["kernels"] if k["repo_id"] == NEXT]
    assert {v["variant"] for r in kernel["revisions"] for v in r["variants"]} == {name}

    info = run_ctl("info", "--store", str(store), f"{NEXT}:2", home=home)
    assert info.rc == 0, info.stderr
    assert name in info.stdout and "layout:  zip" in info.stdout
    info1 = run_ctl("info", "--store", str(store), f"{NEXT}:1", "--json", home=home).json()
    (variant,) = info1["revisions"][0]["variants"]
    assert variant["variant"] == name and variant["metadata"]["build_layout"] == "files"
