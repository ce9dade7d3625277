"""Fixtures for the Hub-compatible test server (pytest plugin, registered by tests/conftest.py).

- `synthetic_hub` / `hub_root`: small kernel repos in Hub layout, built once per session;
- `hub_server`: a session-wide HubServer over them, reset (counters, faults, latency) per test;
- `hub_env`: an isolated HF_HOME / HF_HUB_CACHE per test; huggingface_hub points at the server.

Why `hub_env` patches module attributes and not only the environment: huggingface_hub reads
HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, the token path and the offline flag into
`huggingface_hub.constants` at import time, and `hf_hub_url` builds URLs from
`constants.HUGGINGFACE_CO_URL_TEMPLATE` (also frozen at import) before swapping in an explicit
`endpoint=`. So an endpoint that changes per test needs both `constants.ENDPOINT` and that template
patched; `HfApi()` (which `kernels` creates for every call) then picks the endpoint up. The
environment variables are set too, for subprocesses. `kernels` freezes `KERNELS_CACHE` into
`kernels.hf_hub.CACHE_DIR` / `kernels.resolver.CACHE_DIR` at import; those are reset to None, so it
uses HF_HUB_CACHE.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.gitrepo import GitRepo, kernel_variant_files
from tests.support.hubserver import HubServer

if TYPE_CHECKING:
    from huggingface_hub import HfApi

TRUSTED_ORG = "kerneld-trusted"
UNTRUSTED_ORG = "kerneld-untrusted"
KERNEL_NAME = "scale"
REPO = f"{TRUSTED_ORG}/{KERNEL_NAME}"
BARE_REPO = f"{TRUSTED_ORG}/{KERNEL_NAME}-bare"
UNTRUSTED_REPO = f"{UNTRUSTED_ORG}/{KERNEL_NAME}"
MANY_REPO = f"{TRUSTED_ORG}/many-files"
MANY_FILES = 25
VARIANT = "torch-universal"
FACTORS = {1: 2.0, 2: 3.0}


@dataclass
class SyntheticHub:
    """What `build_synthetic_hub` wrote (REPO's layout): commit ids by ref, files by commit."""

    root: Path
    commits: dict[str, str] = field(default_factory=dict)  # branch or tag name -> commit id
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit id -> path -> bytes
    many_files: dict[str, bytes] = field(default_factory=dict)  # MANY_REPO's files (one commit)

    def variant_files(self, rev: str, variant: str = VARIANT) -> dict[str, bytes]:
        prefix = f"build/{variant}/"
        tree = self.files[self.commits.get(rev, rev)]
        return {p: data for p, data in tree.items() if p.startswith(prefix)}


def _build_scale_repo(path: Path) -> tuple[GitRepo, dict[str, str], dict[str, dict[str, bytes]]]:
    """The `scale` kernel: v1 (factor 2) and v2 (factor 3) branches, main past v2, a slashed branch,
    an annotated and a lightweight tag; `*.bin` tracked by git-lfs."""
    repo = GitRepo(path, lfs=True)
    repo.lfs_track("*.bin")
    tree: dict[str, bytes] = {".gitattributes": (path / ".gitattributes").read_bytes()}
    files: dict[str, dict[str, bytes]] = {}
    commits: dict[str, str] = {}

    def commit(message: str, changes: dict[str, bytes]) -> str:
        tree.update(changes)
        sha = repo.commit(message, changes)
        files[sha] = dict(tree)
        return sha

    readme = b"# scale\n\nA synthetic kernel for kerneld's tests.\n"
    v1 = kernel_variant_files(name=KERNEL_NAME, version=1, factor=FACTORS[1], variant=VARIANT)
    commits["v1"] = commit("v1: scale by 2", {"README.md": readme, **v1})
    repo.branch("v1")
    commits["v1.0.0"] = repo.tag("v1.0.0", message="first release")
    v2 = kernel_variant_files(name=KERNEL_NAME, version=2, factor=FACTORS[2], variant=VARIANT)
    commits["v2"] = commit("v2: scale by 3", v2)
    repo.branch("v2")
    commits["release-2"] = repo.tag("release-2")
    commits["main"] = commit("docs", {"README.md": readme + b"\nmain moved on.\n"})
    repo.checkout("feature/x", create=True, start="v1")
    tree.clear()
    tree.update(files[commits["v1"]])
    commits["feature/x"] = commit("feature work", {"NOTES.md": b"work in progress\n"})
    repo.checkout("main")
    return repo, commits, files


def build_synthetic_hub(root: Path) -> SyntheticHub:
    """Write the synthetic repos under `root/kernels/<org>/<name>` and describe them."""
    kernels = root / "kernels"
    hub = SyntheticHub(root=root)
    repo, hub.commits, hub.files = _build_scale_repo(kernels / TRUSTED_ORG / KERNEL_NAME)
    repo.clone_bare(kernels / TRUSTED_ORG / f"{KERNEL_NAME}-bare")
    shutil.copytree(repo.path, kernels / UNTRUSTED_ORG / KERNEL_NAME, symlinks=True)
    many = GitRepo(kernels / TRUSTED_ORG / "many-files")
    hub.many_files = {
        f"dir{i % 3}/file{i:02d}.txt": f"file {i}\n".encode() for i in range(MANY_FILES)
    }
    many.commit("many files", hub.many_files)
    return hub


@pytest.fixture(scope="session")
def synthetic_hub(tmp_path_factory: pytest.TempPathFactory) -> SyntheticHub:
    return build_synthetic_hub(tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="session")
def hub_root(synthetic_hub: SyntheticHub) -> Path:
    """Directory holding `kernels/<org>/<name>` git repos (the synthetic ones)."""
    return synthetic_hub.root


DEFAULT_TRUST = {TRUSTED_ORG: True, UNTRUSTED_ORG: False}


@pytest.fixture(scope="session")
def _hub_server_session(hub_root: Path) -> Iterator[HubServer]:
    with HubServer(hub_root, trusted_orgs=DEFAULT_TRUST) as server:
        yield server


@pytest.fixture
def hub_server(_hub_server_session: HubServer) -> Iterator[HubServer]:
    """The session's server, with fresh counters and no faults; fails the test on a server bug."""
    server = _hub_server_session
    server.reset()
    yield server
    errors = list(server.errors)
    server.reset()
    assert not errors, f"hub server raised: {errors}"


@dataclass
class HubEnv:
    """An isolated huggingface_hub setup pointed at one endpoint."""

    endpoint: str
    hf_home: Path
    cache_dir: Path

    def api(self) -> HfApi:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=False)


def point_hf_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_home: Path) -> HubEnv:
    """Point huggingface_hub (and kernels, if imported) at `endpoint` with a fresh HF_HOME, no
    token, online, telemetry on (with it off kernels 0.17.2 sends an illegal User-Agent)."""
    from huggingface_hub import constants

    cache = hf_home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    for var in (
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "KERNELS_CACHE",
        "LOCAL_KERNELS",
        "HF_HUB_DISABLE_TELEMETRY",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_XET_CACHE", str(hf_home / "xet"))
    monkeypatch.setattr(constants, "HF_ASSETS_CACHE", str(hf_home / "assets"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(hf_home / ".agent_harnesses.json"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    for mod in ("kernels.hf_hub", "kernels.resolver"):
        if mod in sys.modules:
            monkeypatch.setattr(sys.modules[mod], "CACHE_DIR", None)
    return HubEnv(endpoint=endpoint, hf_home=hf_home, cache_dir=cache)


@pytest.fixture
def hub_env(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubEnv:
    """huggingface_hub (and kernels) pointed at `hub_server`, with this test's own empty cache."""
    return point_hf_at(monkeypatch, hub_server.url, tmp_path / "hf-home")


def snapshot_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (symlinks followed), keyed by relative POSIX path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
