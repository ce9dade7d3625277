"""The Hub repos the benchmark loads from: the example kernels plus a pure-PyTorch noarch kernel
the bench writes itself, and synthetic repos (any files, LFS objects of any size) for scenarios
that need more than the examples."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.kernels.build import make_hub
from examples.kernels.built import BuiltExamples
from examples.kernels.specs import ORG

NOARCH_KERNEL = "bench-noarch"
# The three kernels every rank of the cold start loads: two compiled examples (activation's
# native library is an LFS file) and one pure-PyTorch noarch kernel written by the bench.
COLD_KERNELS = ("activation", "relu2", NOARCH_KERNEL)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "kerneld bench",
    "GIT_AUTHOR_EMAIL": "bench@kerneld.invalid",
    "GIT_COMMITTER_NAME": "kerneld bench",
    "GIT_COMMITTER_EMAIL": "bench@kerneld.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}


@dataclass(frozen=True)
class LfsFile:
    """A file stored through git LFS: the pointer goes into git, the object next to it. `write`
    streams the content into a file object (so 1 GiB never sits in memory)."""

    size: int
    write: Callable[[Any], None]


FileSpec = bytes | LfsFile


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr}")
    return proc.stdout.strip()


def write_lfs_object(git_dir: Path, spec: LfsFile, staging: Path) -> str:
    """Write an LFS object under `<git_dir>/lfs/objects`; returns its pointer text."""
    h = hashlib.sha256()
    staging.parent.mkdir(parents=True, exist_ok=True)

    class Tee:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, data: bytes) -> None:
            h.update(data)
            self.f.write(data)

    with open(staging, "wb") as f:
        spec.write(Tee(f))
    oid = h.hexdigest()
    dest = git_dir / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        staging.unlink()
    else:
        staging.rename(dest)
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {spec.size}\n"


def write_hub_repo(
    hub_root: Path,
    repo_id: str,
    commits: Sequence[tuple[Sequence[str], Mapping[str, FileSpec]]],
) -> list[str]:
    """A Hub-style git repo at `<hub_root>/kernels/<repo_id>`: one commit per entry (each
    replaces the whole tree), the entry's names made branches pointing at it. LFS objects are
    laid out as the test Hub server serves them. Returns the commit shas in order."""
    repo = hub_root / "kernels" / repo_id
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    git_dir = repo / ".git"
    shas = []
    for i, (branches, files) in enumerate(commits):
        for child in repo.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        for rel, spec in files.items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(spec, LfsFile):
                path.write_text(write_lfs_object(git_dir, spec, git_dir / "lfs" / "tmp" / rel))
            else:
                path.write_bytes(spec)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {i}")
        sha = _git(repo, "rev-parse", "HEAD")
        for name in branches:
            if name != "main":
                _git(repo, "branch", "-f", name, sha)
        shas.append(sha)
    return shas


def variant_files(
    variant: str,
    files: Mapping[str, bytes],
    big: Mapping[str, LfsFile] | None = None,
    *,
    module_id: str,
    name: str,
    digests: Mapping[str, str] | None = None,
) -> dict[str, FileSpec]:
    """`build/<variant>/...` with a metadata.json whose digest covers every file: `digests`
    (base64 sha256) must be given for the `big` files."""
    import base64

    digest = {p: base64.b64encode(hashlib.sha256(d).digest()).decode() for p, d in files.items()}
    digest.update(digests or {})
    meta = {
        "id": module_id,
        "name": name,
        "version": 1,
        "license": "Apache-2.0",
        "kernels-minver": "0.17.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": dict(sorted(digest.items()))},
    }
    out: dict[str, FileSpec] = {f"build/{variant}/{p}": d for p, d in files.items()}
    out.update({f"build/{variant}/{p}": s for p, s in (big or {}).items()})
    out[f"build/{variant}/metadata.json"] = (json.dumps(meta, indent=2) + "\n").encode()
    return out


NOARCH_INIT = '''\
"""A small pure-PyTorch kernel written by kerneld's benchmark (noarch, torch-universal)."""

import torch

__version__ = "1.0.0"


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) ** 2
'''


def write_noarch_kernel(hub_root: Path) -> None:
    """The third cold-start kernel: `<ORG>/bench-noarch`, one torch-universal variant (the
    variant both loaders fall back to when no arch build exists), branches main and v1."""
    module_id = "_bench_noarch_0c3a1f2"
    files = {"__init__.py": NOARCH_INIT.encode()}
    tree = variant_files("torch-universal", files, module_id=module_id, name=NOARCH_KERNEL)
    tree["README.md"] = b"---\nlibrary_name: kernels\n---\n\n# bench-noarch\n"
    write_hub_repo(hub_root, f"{ORG}/{NOARCH_KERNEL}", [(("main", "v1"), tree)])


def make_bench_hub(dest: Path, built: BuiltExamples) -> Path:
    """The example repos plus the bench's noarch kernel; returns the Hub root."""
    hub = make_hub(dest, built=built)
    write_noarch_kernel(hub.root)
    return hub.root
