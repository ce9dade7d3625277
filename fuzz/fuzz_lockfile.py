"""atheris target: kernels.lock in both formats (`kerneld_client.lockfile.parse_lockfile`)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from _harness import Target, run


def make() -> tuple[Target, Mapping[str, bytes]]:
    from tests.fuzz import invariants as inv

    new = [
        {"dependency": {"repo-id": "org/a", "version": 1}, "lock": {"commit": "a" * 40}},
        {"dependency": {"repo-id": "org/b", "revision": "main"}, "lock": {"commit": "b" * 64}},
    ]
    old = [
        {
            "repo_id": "org/a",
            "sha": "c" * 40,
            "variants": {
                "torch-universal": {"hash": "sha256-" + "d" * 64, "hash_type": "git_lfs_concat"}
            },
        }
    ]
    seeds = {
        "new": json.dumps(new, indent=2).encode(),
        "old": json.dumps(old).encode(),
        "empty": b"[]",
    }
    return inv.check_lockfile, seeds


if __name__ == "__main__":
    run("lockfile", ["kerneld_client.lockfile"], make)
