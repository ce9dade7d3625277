"""Stand-ins for the Hub repos the `kernels` 0.17.2 test suite names, in Hub layout.

The suite was written against the real Hub; here the Hub test server serves these instead. Each
stand-in is a small pure-PyTorch kernel (a `torch-universal` variant, so it loads on this CPU
machine) that does what the tests check: `kernels-test/versions` reports its version on every
version branch, `kernels-community/relu` is a relu, `backward-marker-test` has layers with and
without a backward. Repos the tests name but that only matter on a GPU, for signed kernels, for
Python dependencies or for TVM-FFI are not stood in; those tests fail on the baseline too and so
are outside the comparison (docs/kernels-compatibility.md says which).

Each stand-in has the branches the tests name and no others: `main` only where the tests load
`main` (the real `kernels-test/silu-and-mul` has none, so `LayerRepository(revision="main")` of it
is a revision the repo lacks, and `kernels` raises an `HfHubHTTPError` there).
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.support.gitrepo import GitRepo, run_git, variant_digest

#: Organisations the stand-in Hub calls trusted kernel publishers; every other is untrusted.
TRUSTED_ORGS = ("kernels-community", "kernels-test")
VARIANT = "torch-universal"
_SCRATCH = "standin-build"

_RELU = """
import torch


def relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)
"""

_SILU_AND_MUL = """
import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
"""

_SILU_AND_MUL_LAYER = """
import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]
"""

_VERSION = """
def version() -> int:
    return {version}
"""

_VERSION_LAYER = """
from torch import nn


class Version(nn.Module):
    def forward(self) -> int:
        return {version}
"""

# Layers that replace an nn.Linear: one declares a backward, one declares none, one says
# nothing (a backward is assumed).
_LINEAR_LAYERS = """
import torch
import torch.nn.functional as F
from torch import nn


class LinearBackward(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias)


class LinearNoBackward(nn.Module):
    has_backward = False
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias)


class LinearImplicitBackward(nn.Module):
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias)
"""


def _source(text: str, **values: object) -> bytes:
    return textwrap.dedent(text).lstrip().format(**values).encode()


def variant_files(
    repo_id: str,
    version: int,
    *,
    init: str,
    layers: str | None = None,
    python_depends: tuple[str, ...] = (),
) -> dict[str, bytes]:
    """One `torch-universal` build variant, keyed by repo path, with the metadata `kernels`
    0.17.2 requires and a digest of every file."""
    name = repo_id.split("/")[1]
    files = {"__init__.py": _source(init + ("\nfrom . import layers\n" if layers else ""))}
    if layers:
        files["layers.py"] = _source(layers)
    tag = hashlib.sha256(f"{repo_id}/{version}/{init}".encode()).hexdigest()[:7]
    metadata = {
        "id": f"_{name.replace('-', '_')}_{tag}",
        "name": name,
        "version": version,
        "license": "Apache-2.0",
        "python-depends": list(python_depends),
        "backend": {"type": "cpu"},
        "kernels-minver": "0.17.0",
        "digest": {"algorithm": "sha256", "files": variant_digest(files)},
    }
    files["metadata.json"] = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    return {f"build/{VARIANT}/{rel}": data for rel, data in files.items()}


@dataclass(frozen=True)
class Release:
    """One commit of a stand-in: the branches that point at it, and its variant."""

    branches: tuple[str, ...]
    version: int
    init: str
    layers: str | None = None
    python_depends: tuple[str, ...] = ()


def _releases() -> dict[str, list[Release]]:
    def versions(n: int, branches: tuple[str, ...]) -> Release:
        return Release(
            branches,
            n,
            _VERSION.replace("{version}", str(n)),
            _VERSION_LAYER.replace("{version}", str(n)),
        )

    silu = Release(("main", "v1"), 1, _SILU_AND_MUL, _SILU_AND_MUL_LAYER)
    return {
        # Numerical order matters to the tests (2 before 10); main is at v2.
        "kernels-test/versions": [
            versions(1, ("v1",)),
            versions(10, ("v10",)),
            versions(2, ("v2", "main")),
        ],
        "kernels-community/relu": [Release(("main", "v1"), 1, _RELU)],
        # No `main`: test_local_overrides_layer needs a revision the repo lacks (`layers` is
        # named by test_mapping_contexts' mappings).
        "kernels-test/silu-and-mul": [
            Release(("v1", "layers"), 1, _SILU_AND_MUL, _SILU_AND_MUL_LAYER)
        ],
        "kernels-test/backward-marker-test": [Release(("main", "v1"), 1, "", _LINEAR_LAYERS)],
        "kernels-test-untrusted/not-a-trused-org-kernel": [silu],
        "kernels-test-untrusted/ci-test-kernel": [silu],
        "untrusted-org/allowed-kernel": [silu],
        # A function kernel (FuncRepository's `silu_and_mul`) on every branch the tests name.
        "kernels-test/flattened-build": [
            Release(("main", "pre-flattening", "without-compat-module"), 1, _SILU_AND_MUL)
        ],
        # A Python dependency kernels does not allow: its validators refuse the kernel before
        # any of its code runs (the import of the missing module would fail otherwise).
        "kernels-test/python-invalid-dep": [
            Release(
                ("main",),
                1,
                "import kepler22b  # noqa: F401\n" + _RELU,
                python_depends=("kepler-22b",),
            )
        ],
    }


def build_standins(root: Path) -> dict[str, dict[str, str]]:
    """Write every stand-in under `root/kernels/<org>/<name>`; repo -> branch -> commit (only
    the branches its releases name)."""
    commits: dict[str, dict[str, str]] = {}
    for repo_id, releases in _releases().items():
        # Built on a scratch branch, deleted at the end: the repo has the branches named, no more.
        repo = GitRepo(root / "kernels" / repo_id, default_branch=_SCRATCH)
        table = commits.setdefault(repo_id, {})
        for release in releases:
            files = variant_files(
                repo_id,
                release.version,
                init=release.init,
                layers=release.layers,
                python_depends=release.python_depends,
            )
            sha = repo.commit(f"version {release.version}", files)
            for branch in release.branches:
                table[branch] = repo.branch(branch, sha, force=True)
        repo.checkout("main" if "main" in table else releases[0].branches[0])
        run_git(repo.path, "branch", "-q", "-D", _SCRATCH)
    return commits
