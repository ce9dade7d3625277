"""atheris target: metadata.json parsing and the digest check (`kerneld.store.manifest`), and
through a real store's publish path when the document parses (then the daemon's readers:
metadata_to_proto and kernel-depends)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from _harness import Target, run, workdir


def make() -> tuple[Target, Mapping[str, bytes]]:
    from tests.fuzz import builders, harnesses
    from tests.fuzz import invariants as inv

    files = {"__init__.py": b"X = 1\n", "_ops.py": b"# ops\n"}
    harness = harnesses.StoreHarness(workdir("metadata"))

    def target(data: bytes) -> None:
        inv.check_metadata(data, files)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return
        if isinstance(doc, dict):
            harness.publish({**files, "metadata.json": data})

    valid = builders.variant_files({"_ops.py": b"# ops\n"})["metadata.json"]
    deps = json.loads(valid)
    deps["kernel-depends"] = [
        {"repo-id": "org/dep", "version": 1},
        {"repo-id": "org/x", "revision": "main"},
    ]
    sha512 = json.loads(valid)
    sha512["digest"] = {"algorithm": "sha512", "files": inv.metadata_digest(files, "sha512")}
    seeds = {
        "valid": valid,
        "depends": json.dumps(deps).encode(),
        "sha512": json.dumps(sha512).encode(),
        "nodigest": b'{"id": "_k", "backend": {"type": "cuda", "archs": ["9.0"]}}',
    }
    return target, seeds


if __name__ == "__main__":
    run(
        "metadata",
        [
            "kerneld.store",
            "kerneld.store.manifest",
            "kerneld.pipeline.resolve",
            "kerneld.server.fronts.rpc.convert",
        ],
        make,
    )
