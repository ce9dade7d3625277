"""The kernels the chaos clients load, laid out as Hub git repos, and their ground truth.

The example kernels (`activation` with a native `.so` over LFS plus noarch variants, `relu2`;
branches v1/v2/main and tags) give real compiled code; a few synthetic noarch `scale` kernels
add distinct trees so that GC under a small cap really has something to evict.

The ground truth is read from the git repositories themselves (LFS oids and blob contents), never
from the daemon: if the daemon published bytes the publisher did not publish (a corrupted body
that slipped through verification), its own manifest would agree with them, but the ground truth
would not. Clients hash the tree they imported; `checks` compares against this.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from examples.kernels.build import build_examples, make_hub
from tests.support.gitrepo import GitRepo, kernel_variant_files
from tests.support.hubgit import GitBackend, find_git_dir

EXAMPLES_ORG = "kerneld-examples"
SYNTH_ORG = "kerneld-chaos"
ABSENT_REPO = f"{SYNTH_ORG}/absent"


def scale_factor(index: int, version: int) -> float:
    """The factor synthetic kernel `scale<index>` multiplies by in `version` (tells them apart)."""
    return float(2 + index + 10 * (version - 1))


@dataclass(frozen=True)
class Choice:
    """One thing a client may ask for: a repo and a selector (version or revision)."""

    repo: str
    kind: str
    """activation, relu2, scale (synthetic) or absent (does not exist upstream)."""
    weight: float
    version: int | None = None
    revision: str | None = None
    commit: str | None = None
    """What the selector names on the Hub (refs never move during a run); None if nothing."""

    @property
    def label(self) -> str:
        return (
            f"{self.repo}:{self.version}"
            if self.version is not None
            else f"{self.repo}@{self.revision}"
        )


@dataclass
class Catalog:
    """Every choice and the ground truth of every (repo, commit, variant) on the Hub."""

    root: str
    choices: list[Choice]
    expected: dict[str, dict[str, str]] = field(default_factory=dict)
    """`repo@commit/variant` -> {path in the variant folder: sha256 hex}."""
    repo_files: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    """`repo@commit` -> {repo path: (sha256 hex, size)}: to count bytes the Hub served."""
    versions: dict[str, int] = field(default_factory=dict)
    """`repo@commit` -> the kernel version that commit carries (from metadata.json)."""
    factors: dict[str, float] = field(default_factory=dict)
    """`repo@commit` -> the factor of a synthetic scale kernel."""
    refs: dict[str, dict[str, str]] = field(default_factory=dict)
    """repo -> ref name (branch or tag) -> commit."""
    best_tree_bytes: int = 0
    """Summed size of the best (arch-specific if any) variant of every commit clients load."""

    @staticmethod
    def key(repo: str, commit: str, variant: str | None = None) -> str:
        return f"{repo}@{commit}" if variant is None else f"{repo}@{commit}/{variant}"

    def repos(self) -> list[str]:
        return sorted(self.refs)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["repo_files"] = {
            k: {p: list(v) for p, v in f.items()} for k, f in self.repo_files.items()
        }
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Catalog:
        cat = cls(root=doc["root"], choices=[Choice(**c) for c in doc["choices"]])
        cat.expected = doc["expected"]
        cat.repo_files = {
            k: {p: (v[0], int(v[1])) for p, v in f.items()} for k, f in doc["repo_files"].items()
        }
        cat.versions = doc["versions"]
        cat.factors = doc["factors"]
        cat.refs = doc["refs"]
        cat.best_tree_bytes = int(doc["best_tree_bytes"])
        return cat

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_json()), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> Catalog:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))


def _build_scale_repo(path: Path, index: int, data_size: int) -> None:
    """`scale<index>`: v1 and v2 (different factors and data), main one docs commit past v2."""
    name = f"scale{index}"
    repo = GitRepo(path, lfs=True)
    repo.lfs_track("*.bin")
    readme = f"# {name}\n\nA synthetic kernel for kerneld's chaos harness.\n".encode()
    for version in (1, 2):
        files: dict[str, bytes | str | None] = {"README.md": readme}
        files.update(
            kernel_variant_files(
                name=name,
                version=version,
                factor=scale_factor(index, version),
                data_size=data_size + 4096 * version,
            )
        )
        repo.commit(f"v{version}", files)
        repo.branch(f"v{version}")
        repo.tag(f"v{version}.0.0")
    repo.commit("docs", {"README.md": readme + b"\nmain moved on.\n"})


def _ground_truth(cat: Catalog, repo_id: str, git_dir: Path) -> None:
    backend = GitBackend(git_dir)
    try:
        refs = backend.refs()
        cat.refs[repo_id] = {
            name.split("/", 2)[2]: commit
            for name, commit in refs.items()
            if name.startswith(("refs/heads/", "refs/tags/"))
        }
        for commit in sorted(set(cat.refs[repo_id].values())):
            files: dict[str, tuple[str, int]] = {}
            variants: dict[str, dict[str, str]] = defaultdict(dict)
            for path, entry in backend.tree(commit).items():
                if entry.type != "file":
                    continue
                if entry.lfs_oid is not None:
                    sha = entry.lfs_oid
                else:
                    obj = backend.read_object(entry.oid)
                    assert obj is not None, f"{repo_id}: blob {entry.oid} missing"
                    sha = hashlib.sha256(obj[1]).hexdigest()
                files[path] = (sha, entry.size)
                parts = path.split("/", 2)
                if len(parts) == 3 and parts[0] == "build":
                    variants[parts[1]][parts[2]] = sha
            cat.repo_files[Catalog.key(repo_id, commit)] = files
            for variant, vfiles in variants.items():
                cat.expected[Catalog.key(repo_id, commit, variant)] = vfiles
                meta_path = f"build/{variant}/metadata.json"
                obj = backend.read_object(backend.tree(commit)[meta_path].oid)
                assert obj is not None
                cat.versions[Catalog.key(repo_id, commit)] = int(json.loads(obj[1])["version"])
            best = sorted(variants, key=lambda v: (v.startswith("torch-"), v))[0]
            cat.best_tree_bytes += sum(files[f"build/{best}/{p}"][1] for p in variants[best])
    finally:
        backend.close()


def build_catalog(root: Path, *, synthetic: int = 6, data_size: int = 48 * 1024) -> Catalog:
    """Lay out the repos under `root/kernels/<org>/<name>` and describe them."""
    built = build_examples()
    make_hub(root, built=built)
    for i in range(synthetic):
        _build_scale_repo(root / "kernels" / SYNTH_ORG / f"scale{i}", i, data_size)
    cat = Catalog(root=str(root), choices=[])
    for org_dir in sorted((root / "kernels").iterdir()):
        for repo_dir in sorted(org_dir.iterdir()):
            git_dir = find_git_dir(repo_dir)
            if git_dir is not None:
                _ground_truth(cat, f"{org_dir.name}/{repo_dir.name}", git_dir)
    for repo_id, refs in cat.refs.items():
        kind = repo_id.split("/", 1)[1].rstrip("0123456789")
        if repo_id.startswith(SYNTH_ORG):
            i = int(repo_id.rsplit("scale", 1)[1])
            for c in set(refs.values()):
                cat.factors[Catalog.key(repo_id, c)] = scale_factor(
                    i, cat.versions[Catalog.key(repo_id, c)]
                )
        # Examples are asked for more often (real compiled code); every selector form appears.
        w = 3.0 if repo_id.startswith(EXAMPLES_ORG) else 1.0
        cat.choices += [
            Choice(repo_id, kind, 2 * w, version=1, commit=refs["v1"]),
            Choice(repo_id, kind, 2 * w, version=2, commit=refs["v2"]),
            Choice(repo_id, kind, w, revision="main", commit=refs["main"]),
            Choice(repo_id, kind, 0.5 * w, revision="v1.0.0", commit=refs["v1.0.0"]),
            Choice(repo_id, kind, 0.5 * w, revision=refs["v2"], commit=refs["v2"]),
        ]
    # Things that do not exist: the answer must be "not found" (a fallback), quickly.
    any_example = f"{EXAMPLES_ORG}/relu2"
    cat.choices += [
        Choice(ABSENT_REPO, "absent", 0.5, version=1),
        Choice(any_example, "absent", 0.5, version=9),
    ]
    return cat
