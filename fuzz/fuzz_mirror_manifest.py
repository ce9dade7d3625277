"""atheris target: the mirror documents (manifests, refs, mirror-info: kerneld.mirror.documents)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from _harness import Target, run


def make() -> tuple[Target, Mapping[str, bytes]]:
    from kerneld.mirror.documents import refs_json
    from tests.fuzz import builders
    from tests.fuzz import invariants as inv

    variants = {
        "torch-universal": builders.variant_files(),
        "torch213-cxx11-cpu-x86_64-linux": builders.variant_files({"a/b.py": b""}),
    }
    manifest = builders.manifest_doc(variants)
    manifest["variants"]["torch-universal"]["files"][0]["mode"] = "0755"
    seeds = {
        "manifest": json.dumps(manifest, indent=1).encode(),
        "refs": refs_json(inv.REPO, {"main": inv.COMMIT}, {"t": inv.COMMIT}, 1.7e9),
        "info": b'{"format": "kerneld-mirror", "version": 1, "name": "x"}',
    }
    return inv.check_mirror_documents, seeds


if __name__ == "__main__":
    run("mirror_manifest", ["kerneld.mirror.documents"], make)
