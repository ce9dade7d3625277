"""Build small git repositories on disk for tests: files per commit, branches, tags, real git-lfs.

Commits get fixed, increasing dates and a fixed author so that two builds of the same script give
the same commit ids, and the host's git configuration (signing, hooks, templates) is ignored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

# 2026-01-01T00:00:00Z; commit n of a repo is dated BASE_EPOCH + n seconds.
BASE_EPOCH = 1_767_225_600

_ISOLATED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "kerneld tests",
    "GIT_AUTHOR_EMAIL": "tests@kerneld.invalid",
    "GIT_COMMITTER_NAME": "kerneld tests",
    "GIT_COMMITTER_EMAIL": "tests@kerneld.invalid",
    "LC_ALL": "C",
}


class GitError(RuntimeError):
    """A git command failed; the message carries its stderr."""


# Set by git when it runs hooks: they would point our commands at the caller's repository.
_REPO_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX")


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for git commands, isolated from the host's git configuration."""
    env = {k: v for k, v in os.environ.items() if k not in _REPO_ENV}
    env.update(_ISOLATED_ENV)
    if extra:
        env.update(extra)
    return env


def run_git(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """Run `git ARGS` in `cwd` and return its stdout (text, stripped)."""
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        capture_output=True,
        env=git_env(env),
        check=False,
    )
    if proc.returncode != 0:
        raise GitError(
            f"git {' '.join(args)} failed in {cwd}: {proc.stderr.decode(errors='replace')}"
        )
    return proc.stdout.decode().strip()


def has_git_lfs() -> bool:
    """Whether the `git lfs` extension is installed (scripts/bootstrap installs it)."""
    proc = subprocess.run(["git", "lfs", "version"], capture_output=True, check=False)
    return proc.returncode == 0


class GitRepo:
    """A non-bare repository under construction; every method leaves the work tree committed."""

    def __init__(self, path: Path, *, default_branch: str = "main", lfs: bool = False) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._n_commits = 0
        run_git(self.path, "init", "-q", "-b", default_branch)
        if lfs:
            if not has_git_lfs():
                raise GitError("git-lfs is not installed (apt-get install git-lfs)")
            run_git(self.path, "lfs", "install", "--local")

    @property
    def git_dir(self) -> Path:
        return self.path / ".git"

    def lfs_track(self, *patterns: str) -> None:
        """Track `patterns` with git-lfs (writes .gitattributes; committed with the next commit)."""
        run_git(self.path, "lfs", "track", *patterns)

    def commit(
        self,
        message: str,
        files: Mapping[str, bytes | str | None] | None = None,
        *,
        allow_empty: bool = False,
    ) -> str:
        """Write `files` (None deletes a path), stage all and commit; returns the commit id."""
        for rel, content in (files or {}).items():
            target = self.path / rel
            if content is None:
                run_git(self.path, "rm", "-q", "-r", "--cached", "--ignore-unmatch", rel)
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)
        run_git(self.path, "add", "-A")
        stamp = f"{BASE_EPOCH + self._n_commits} +0000"
        self._n_commits += 1
        args = ["commit", "-q", "-m", message]
        if allow_empty:
            args.append("--allow-empty")
        run_git(self.path, *args, env={"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
        return self.rev_parse("HEAD")

    def checkout(self, branch: str, *, create: bool = False, start: str | None = None) -> None:
        """Switch the work tree to `branch` (optionally creating it at `start`)."""
        args = ["checkout", "-q"]
        if create:
            args += ["-b", branch]
            if start is not None:
                args.append(start)
        else:
            args.append(branch)
        run_git(self.path, *args)

    def branch(self, name: str, start: str = "HEAD", *, force: bool = False) -> str:
        """Create (or with `force` move) branch `name` at `start`; returns its commit."""
        run_git(self.path, "branch", *(["-f"] if force else []), name, start)
        return self.rev_parse(f"refs/heads/{name}")

    def tag(self, name: str, target: str = "HEAD", *, message: str | None = None) -> str:
        """A lightweight tag, or an annotated one when `message` is given; returns the commit."""
        if message is None:
            run_git(self.path, "tag", name, target)
        else:
            stamp = f"{BASE_EPOCH + self._n_commits} +0000"
            run_git(
                self.path,
                "tag",
                "-a",
                "-m",
                message,
                name,
                target,
                env={"GIT_COMMITTER_DATE": stamp},
            )
        return self.rev_parse(f"refs/tags/{name}^{{commit}}")

    def rev_parse(self, rev: str) -> str:
        return run_git(self.path, "rev-parse", "--verify", "-q", rev)

    def blob_id(self, rev: str, path: str) -> str:
        """Git blob id (sha1) of `path` at `rev`: for an LFS file, that of its pointer."""
        return self.rev_parse(f"{rev}:{path}")

    def lfs_object(self, oid: str) -> Path:
        return self.git_dir / "lfs" / "objects" / oid[:2] / oid[2:4] / oid

    def clone_bare(self, dest: Path) -> Path:
        """A bare clone at `dest` with every branch and tag, and the LFS objects in `dest/lfs`."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        run_git(dest.parent, "clone", "-q", "--bare", "--no-local", str(self.path), str(dest))
        src_lfs = self.git_dir / "lfs" / "objects"
        if src_lfs.is_dir():
            shutil.copytree(src_lfs, dest / "lfs" / "objects")
        return dest


# --- a synthetic kernel in Kernel Hub layout ------------------------------------------------------

_INIT_PY = '''\
"""Synthetic noarch kernel for kerneld's tests: pure Python, so any torch can import it."""

import hashlib
from pathlib import Path

import torch

from . import layers
from ._ops import FACTOR, add_op_namespace_prefix, ops

VERSION = {version}
VARIANT = "{variant}"

__all__ = [
    "FACTOR",
    "VARIANT",
    "VERSION",
    "add_op_namespace_prefix",
    "data_sha256",
    "layers",
    "ops",
    "scale",
]


def scale(x: torch.Tensor) -> torch.Tensor:
    """Multiply by FACTOR, which differs per version, so a test can tell versions apart."""
    return x * FACTOR


def data_sha256() -> str:
    """sha256 of the LFS-tracked data file shipped beside this module."""
    return hashlib.sha256((Path(__file__).parent / "data.bin").read_bytes()).hexdigest()
'''

_OPS_PY = """\
import torch

NAMESPACE = "{ns}"
FACTOR = {factor}
ops = getattr(torch.ops, NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{{NAMESPACE}}::{{op_name}}"
"""

_LAYERS_PY = """\
import torch

from ._ops import FACTOR


class Scale(torch.nn.Module):
    has_backward = True
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * FACTOR
"""


def pseudo_random_bytes(seed: str, size: int) -> bytes:
    """Deterministic incompressible bytes (a sha256 chain), for LFS payloads."""
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


def variant_digest(files: Mapping[str, bytes]) -> dict[str, str]:
    """metadata.json `digest.files`: relpath -> base64(sha256), except metadata.json(.sigstore)."""
    return {
        rel: base64.b64encode(hashlib.sha256(data).digest()).decode()
        for rel, data in sorted(files.items())
        if rel not in ("metadata.json", "metadata.json.sigstore")
    }


def kernel_variant_files(
    *,
    name: str,
    version: int,
    factor: float,
    variant: str = "torch-universal",
    data_size: int = 48 * 1024,
    backend: str = "cpu",
) -> dict[str, bytes]:
    """The files of one build variant, keyed by repo path (`build/<variant>/...`).

    Holds the flattened layout `kernels` imports (`__init__.py` directly in the variant folder),
    `_ops.py`, `layers.py`, an LFS-sized `data.bin` and a `metadata.json` with every field
    `kernels` 0.17.2 requires (id, name, version, license, python-depends, backend) plus a digest.
    """
    python_name = name.replace("-", "_")
    tag = hashlib.sha256(f"{name}/{version}/{variant}/{factor}".encode()).hexdigest()[:7]
    ns = f"_{python_name}_{variant.replace('-', '_')}_{tag}"
    files: dict[str, bytes] = {
        "__init__.py": _INIT_PY.format(version=version, variant=variant).encode(),
        "_ops.py": _OPS_PY.format(ns=ns, factor=factor).encode(),
        "layers.py": _LAYERS_PY.encode(),
        "data.bin": pseudo_random_bytes(f"{name}-{version}-{variant}", data_size),
    }
    metadata = {
        "id": ns,
        "name": name,
        "version": version,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": backend},
        "kernels-minver": "0.17.0",
        "digest": {"algorithm": "sha256", "files": variant_digest(files)},
    }
    files["metadata.json"] = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    return {f"build/{variant}/{rel}": data for rel, data in files.items()}
