"""Kernel repos with `kernel-depends`, in Hub layout, for lock-file tests.

    kerneld-trusted/top     v1: torch-universal -> dep-a v1; torch-cpu -> dep-b @<commit>;
                            also a `build/docs` folder that is not a variant (skipped by lockers)
                            v2: torch-universal, no dependencies
    kerneld-trusted/dep-a   v1 -> dep-b v2;  v2: no dependencies
    kerneld-trusted/dep-b   v1, v2 (and main past v2)

`*.bin` files are git-lfs objects, so old-format hashes mix LFS sha256 and git sha1 ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.gitrepo import GitRepo, kernel_variant_files

ORG = "kerneld-trusted"
TOP, DEP_A, DEP_B = f"{ORG}/top", f"{ORG}/dep-a", f"{ORG}/dep-b"


@dataclass
class LockHub:
    root: Path
    commits: dict[str, dict[str, str]] = field(default_factory=dict)  # repo -> branch -> commit
    files: dict[tuple[str, str], dict[str, bytes | None]] = field(default_factory=dict)
    lfs: set[str] = field(default_factory=set)  # repo paths stored in LFS


def _variant(
    name: str, version: int, variant: str, depends: list[dict[str, object]]
) -> dict[str, bytes | None]:
    files = kernel_variant_files(
        name=name, version=version, factor=float(version), variant=variant, data_size=4096
    )
    meta_path = f"build/{variant}/metadata.json"
    meta = json.loads(files[meta_path])
    if depends:
        meta["kernel-depends"] = depends
    files[meta_path] = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    return dict(files)


def build_lock_hub(root: Path) -> LockHub:
    hub = LockHub(root)
    base = root / "kernels" / ORG

    def repo(name: str) -> GitRepo:
        r = GitRepo(base / name, lfs=True)
        r.lfs_track("*.bin")
        return r

    def commit(r: GitRepo, repo_id: str, message: str, files: dict[str, bytes | None]) -> str:
        sha = r.commit(message, files)
        tree = dict(hub.files.get((repo_id, hub.commits.get(repo_id, {}).get("_last", "")), {}))
        tree.update(files)
        hub.files[(repo_id, sha)] = tree
        hub.commits.setdefault(repo_id, {})["_last"] = sha
        hub.lfs.update(p for p in files if p.endswith(".bin"))
        return sha

    b = repo("dep-b")
    hub.commits[DEP_B] = {}
    hub.commits[DEP_B]["v1"] = commit(b, DEP_B, "v1", _variant("dep-b", 1, "torch-universal", []))
    b.branch("v1")
    hub.commits[DEP_B]["v2"] = commit(b, DEP_B, "v2", _variant("dep-b", 2, "torch-universal", []))
    b.branch("v2")
    hub.commits[DEP_B]["main"] = commit(b, DEP_B, "docs", {"README.md": b"dep-b\n"})

    a = repo("dep-a")
    hub.commits[DEP_A] = {}
    hub.commits[DEP_A]["v1"] = commit(
        a, DEP_A, "v1", _variant("dep-a", 1, "torch-universal", [{"repo-id": DEP_B, "version": 2}])
    )
    a.branch("v1")
    hub.commits[DEP_A]["v2"] = commit(a, DEP_A, "v2", _variant("dep-a", 2, "torch-universal", []))
    a.branch("v2")

    t = repo("top")
    hub.commits[TOP] = {}
    v1_files = {
        **_variant("top", 1, "torch-universal", [{"repo-id": DEP_A, "version": 1}]),
        **_variant(
            "top", 1, "torch-cpu", [{"repo-id": DEP_B, "revision": hub.commits[DEP_B]["v1"]}]
        ),
        "build/docs/README.md": b"not a build variant\n",
    }
    hub.commits[TOP]["v1"] = commit(t, TOP, "v1", v1_files)
    t.branch("v1")
    hub.commits[TOP]["v2"] = commit(
        t, TOP, "v2", {"build/torch-cpu": None, **_variant("top", 2, "torch-universal", [])}
    )
    t.branch("v2")
    for table in hub.commits.values():
        table.pop("_last", None)
    return hub


def old_hash(files: dict[str, bytes | None], variant: str, lfs: set[str]) -> str:
    """The old lock format's variant hash, computed from the repo contents by its definition."""
    prefix = f"build/{variant}/"
    pairs = []
    for path, data in files.items():
        if not path.startswith(prefix) or data is None:
            continue
        rel = path[len(prefix) :]
        if rel.endswith(".pyc") or "__pycache__" in rel.split("/"):
            continue
        if path in lfs:
            oid = hashlib.sha256(data).digest()
        else:
            oid = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
        pairs.append((rel.encode(), oid))
    h = hashlib.sha256()
    for name, oid in sorted(pairs):
        h.update(name)
        h.update(oid)
    return "sha256-" + h.hexdigest()
