"""Publish the example kernels as a kerneld mirror directory (kerneld.mirror.documents's layout).

The mirror carries the same commits as the example git repos (branches main, v1, v2 and the tags),
so a daemon fed from it and one fed from a Hub serving those repos agree on every commit id.
Cached next to the example build: a second call only checks that the mirror is complete.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from examples.kernels.build import build_examples, make_hub
from examples.kernels.built import BuiltExamples
from kerneld.mirror.documents import INFO, Manifest, MirrorWriter
from kerneld.upstream.base import RemoteFile


@dataclass(frozen=True)
class ExampleMirror:
    root: Path
    repos: dict[str, dict[str, str]]  # repo id -> branch -> commit
    built: BuiltExamples


def build_example_mirror(
    dest: Path | None = None, built: BuiltExamples | None = None
) -> ExampleMirror:
    built = built or build_examples()
    root = dest or built.root.parent / f"mirror-{built.cache_key}"
    with tempfile.TemporaryDirectory() as tmp:
        hub = make_hub(Path(tmp), built=built)
        repos = {repo.repo_id: dict(repo.branches) for repo in hub.repos}
        if (root / INFO).is_file():
            return ExampleMirror(root, repos, built)
        writer = MirrorWriter(root, name="kerneld-examples")
        for repo in hub.repos:
            commits = {**repo.branches, **repo.tags}
            for ref, commit in sorted(commits.items()):
                version = repo.branch_versions.get(ref) or int(ref.lstrip("v").split(".")[0])
                kernel = built.kernel(repo.name, version)
                variants: dict[str, list[RemoteFile]] = {}
                for variant in kernel.variants:
                    files = []
                    for rel in variant.files:
                        data = (variant.path / rel).read_bytes()
                        sha = hashlib.sha256(data).hexdigest()
                        writer.write_blob(sha, data)
                        files.append(RemoteFile(rel, len(data), sha256=sha))
                    variants[variant.variant] = files
                writer.write_manifest(Manifest(repo.repo_id, commit, variants))
            writer.write_refs(repo.repo_id, repo.branches, repo.tags)
        writer.write_info()  # last: its presence marks a complete mirror
    return ExampleMirror(root, repos, built)
