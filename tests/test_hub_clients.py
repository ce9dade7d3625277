"""The real clients against the test server: huggingface_hub 2.4 (refs, info, tree, paths-info,
downloads, snapshots) and kernels 0.17.2 (`get_kernel`, publisher trust). If these pass, the
server is a faithful enough Hub for kerneld's integration tests."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from tests.fixtures_hub import (
    BARE_REPO,
    FACTORS,
    MANY_FILES,
    MANY_REPO,
    REPO,
    UNTRUSTED_REPO,
    VARIANT,
    HubEnv,
    SyntheticHub,
    point_hf_at,
    snapshot_files,
)
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

DATA = f"build/{VARIANT}/data.bin"  # LFS-tracked
INIT = f"build/{VARIANT}/__init__.py"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --- huggingface_hub ------------------------------------------------------------------------------


def test_list_repo_refs(
    hub_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    refs = hub_env.api().list_repo_refs(REPO, repo_type="kernel")
    c = synthetic_hub.commits
    assert {b.name: b.target_commit for b in refs.branches} == {
        n: c[n] for n in ("main", "v1", "v2", "feature/x")
    }
    assert {t.name: t.target_commit for t in refs.tags} == {"v1.0.0": c["v1"], "release-2": c["v2"]}
    assert refs.converts == []
    assert hub_server.counts["refs"] == 1


@pytest.mark.parametrize(
    ("revision", "ref"),
    [
        (None, "main"),
        ("v1", "v1"),
        ("refs/heads/v2", "v2"),
        ("v1.0.0", "v1"),
        ("feature/x", "feature/x"),
        ("commit:v2", "v2"),
    ],
)
def test_repo_info(
    hub_env: HubEnv, synthetic_hub: SyntheticHub, revision: str | None, ref: str
) -> None:
    if revision is not None and revision.startswith("commit:"):
        revision = synthetic_hub.commits[revision.removeprefix("commit:")]
    info = hub_env.api().repo_info(REPO, repo_type="kernel", revision=revision)
    assert info.id == REPO
    assert info.sha == synthetic_hub.commits[ref]
    assert isinstance(info.last_modified, datetime)
    assert info.last_modified.tzinfo == timezone.utc
    assert info.last_modified.year == 2026


def test_list_repo_tree_recursive_expand_paginated(
    hub_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    hub_server.expand_page_size = 3
    commit = synthetic_hub.commits["v2"]
    items = list(
        hub_env.api().list_repo_tree(
            REPO, repo_type="kernel", revision="v2", recursive=True, expand=True
        )
    )
    files = synthetic_hub.files[commit]
    by_path = {i.path: i for i in items}
    assert {p for p, i in by_path.items() if isinstance(i, RepoFile)} == set(files)
    assert {p for p, i in by_path.items() if isinstance(i, RepoFolder)} == {
        "build",
        f"build/{VARIANT}",
    }
    data = by_path[DATA]
    assert isinstance(data, RepoFile) and data.lfs is not None
    assert data.lfs.sha256 == hashlib.sha256(files[DATA]).hexdigest()
    assert data.lfs.size == data.size == len(files[DATA])
    assert data.xet_hash is None
    init = by_path[INIT]
    assert isinstance(init, RepoFile)
    assert init.lfs is None
    assert init.blob_id == git_blob_sha1(files[INIT])
    assert init.last_commit is not None and init.last_commit.oid == commit
    assert hub_server.counts["tree"] == -(-len(items) // 3)


def test_list_repo_tree_pages_of_a_large_tree(hub_env: HubEnv, hub_server: HubServer) -> None:
    hub_server.page_size = 10
    items = list(hub_env.api().list_repo_tree(MANY_REPO, repo_type="kernel", recursive=True))
    assert len([i for i in items if isinstance(i, RepoFile)]) == MANY_FILES
    assert hub_server.counts["tree"] == 3


def test_get_paths_info(hub_env: HubEnv, synthetic_hub: SyntheticHub) -> None:
    infos = hub_env.api().get_paths_info(
        REPO, [DATA, "build", "README.md", "missing"], repo_type="kernel", revision="v1"
    )
    by_path = {i.path: i for i in infos}
    assert set(by_path) == {DATA, "build", "README.md"}
    assert isinstance(by_path["build"], RepoFolder)
    data = by_path[DATA]
    assert isinstance(data, RepoFile) and data.lfs is not None
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    assert data.lfs.sha256 == hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("repo", [REPO, BARE_REPO])
@pytest.mark.parametrize("revision", ["v1", "v1.0.0", "refs/heads/v1", "commit"])
def test_hf_hub_download_plain_and_lfs(
    hub_env: HubEnv,
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
    repo: str,
    revision: str,
) -> None:
    commit = synthetic_hub.commits["v1"]
    rev = commit if revision == "commit" else revision
    api = hub_env.api()
    for filename in (INIT, DATA):
        path = api.hf_hub_download(repo, filename, repo_type="kernel", revision=rev)
        assert Path(path).read_bytes() == synthetic_hub.files[commit][filename]
        assert f"/snapshots/{commit}/" in path
    assert hub_server.counts["resolve_head"] == 2
    assert hub_server.counts["resolve_get"] == 2
    # the blob is stored under its ETag: git sha1 for plain files, sha256 for LFS files
    blobs = {
        p.name
        for p in (hub_env.cache_dir / f"kernels--{repo.replace('/', '--')}" / "blobs").iterdir()
    }
    files = synthetic_hub.files[commit]
    assert blobs == {git_blob_sha1(files[INIT]), hashlib.sha256(files[DATA]).hexdigest()}


def test_cached_download_with_commit_makes_no_request(
    hub_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    commit = synthetic_hub.commits["v2"]
    api = hub_env.api()
    first = api.hf_hub_download(REPO, DATA, repo_type="kernel", revision=commit)
    assert hub_server.total() == 2
    hub_server.reset_counts()
    second = api.hf_hub_download(REPO, DATA, repo_type="kernel", revision=commit)
    assert second == first
    assert hub_server.total(exclude=()) == 0
    api.hf_hub_download(REPO, DATA, repo_type="kernel", revision="v2")  # a branch: asks again
    assert hub_server.counts["resolve_head"] == 1
    assert hub_server.counts["resolve_get"] == 0


@pytest.mark.parametrize(
    ("repo", "revision", "ref"),
    [
        (REPO, "v1", "v1"),
        (REPO, "v2", "v2"),
        (REPO, "release-2", "v2"),
        (REPO, "commit:v1", "v1"),
        (BARE_REPO, "v2", "v2"),
        (REPO, "feature/x", "feature/x"),
    ],
)
def test_snapshot_download_variant(
    hub_env: HubEnv,
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
    repo: str,
    revision: str,
    ref: str,
) -> None:
    commit = synthetic_hub.commits[ref]
    if revision.startswith("commit:"):
        revision = commit
    folder = hub_env.api().snapshot_download(
        repo, repo_type="kernel", revision=revision, allow_patterns=f"build/{VARIANT}/*"
    )
    assert Path(folder).name == commit
    assert snapshot_files(Path(folder)) == synthetic_hub.variant_files(ref)
    n = len(synthetic_hub.variant_files(ref))
    expected_info = 0 if revision == commit else 1  # a commit id needs no repo_info call
    assert hub_server.counts == {
        **({"info": 1} if expected_info else {}),
        "tree": 1,
        "resolve_head": n,
        "resolve_get": n,
    }


def test_client_errors_map_to_hub_exceptions(hub_env: HubEnv, hub_server: HubServer) -> None:
    api = hub_env.api()
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_refs("nobody/nothing", repo_type="kernel")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(REPO, repo_type="kernel", revision="v99")
    with pytest.raises(RevisionNotFoundError):
        api.hf_hub_download(REPO, INIT, repo_type="kernel", revision="v99")
    with pytest.raises(RemoteEntryNotFoundError):
        api.hf_hub_download(REPO, "build/missing.py", repo_type="kernel", revision="v1")
    # the missing entry is remembered per commit, as on the real Hub
    no_exist = hub_env.cache_dir / f"kernels--{REPO.replace('/', '--')}" / ".no_exist"
    assert [p.name for p in no_exist.iterdir()] == [
        api.repo_info(REPO, repo_type="kernel", revision="v1").sha
    ]
    hub_server.gated.add(REPO)
    with pytest.raises(GatedRepoError):
        api.hf_hub_download(REPO, INIT, repo_type="kernel", revision="v1")


def test_client_does_not_check_content(
    hub_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    """Why kerneld re-hashes every byte: huggingface_hub keeps a corrupted download."""
    hub_server.inject(Fault(pattern="*/data.bin", kind="corrupt", times=1))
    path = hub_env.api().hf_hub_download(REPO, DATA, repo_type="kernel", revision="v1")
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    got = Path(path).read_bytes()
    assert len(got) == len(content)
    assert got != content
    assert Path(path).resolve().name == hashlib.sha256(content).hexdigest()  # named as if right


def test_client_retries_truncated_download(
    hub_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    """A body shorter than its Content-Length is detected and fetched again after ~1 s. The retry
    asks for a Range only past bytes already written, and huggingface_hub writes in 10 MB chunks,
    so for a small file the retry is a plain full GET."""
    fault = hub_server.inject(Fault(pattern="*/data.bin", kind="truncate", times=1))
    path = hub_env.api().hf_hub_download(REPO, DATA, repo_type="kernel", revision="v1")
    assert Path(path).read_bytes() == synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    assert fault.fired == 1
    assert hub_server.counts["resolve_get"] == 2
    assert [r.status for r in hub_server.requests if r.kind == "resolve_get"] == [200, 200]


# --- kernels --------------------------------------------------------------------------------------


@pytest.fixture
def kernels_mod(hub_env: HubEnv) -> ModuleType:
    """`kernels`, imported after hub_env cleared KERNELS_CACHE (read at import)."""
    import kernels

    return cast(ModuleType, kernels)


def _torch() -> ModuleType:
    import torch

    return torch


def test_get_kernel_cold_then_warm(
    hub_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub, kernels_mod: ModuleType
) -> None:
    torch = _torch()
    kernel = kernels_mod.get_kernel(REPO, version=1)
    assert kernel.VERSION == 1
    assert torch.equal(kernel.scale(torch.ones(3)), torch.full((3,), FACTORS[1]))
    assert torch.equal(kernel.layers.Scale()(torch.ones(2)), torch.full((2,), FACTORS[1]))
    data = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    assert kernel.data_sha256() == hashlib.sha256(data).hexdigest()  # LFS content arrived
    n_files = len(synthetic_hub.variant_files("v1"))
    cold = hub_server.counts
    cold.pop("agent_harnesses", None)  # probed once per process by huggingface_hub's telemetry
    assert cold == {
        "org_overview": 1,  # trust check
        "refs": 1,  # version=1 -> branch v1
        "tree": 2,  # variant listing of build/, then the snapshot's recursive listing
        "resolve_head": n_files,
        "resolve_get": n_files,
    }
    hub_server.reset_counts()
    again = kernels_mod.get_kernel(REPO, version=1)
    assert again.scale(torch.ones(1)).item() == FACTORS[1]
    assert hub_server.counts == {"org_overview": 1, "refs": 1, "tree": 1}


@pytest.mark.parametrize(
    ("kwargs", "version"),
    [
        ({"version": 2}, 2),
        ({"revision": "v1.0.0"}, 1),
        ({"revision": "release-2"}, 2),
        ({"revision": "main"}, 2),
    ],
)
def test_get_kernel_versions_and_revisions(
    hub_env: HubEnv, kernels_mod: ModuleType, kwargs: dict[str, object], version: int
) -> None:
    torch = _torch()
    kernel = kernels_mod.get_kernel(REPO, **kwargs)
    assert version == kernel.VERSION
    assert kernel.scale(torch.ones(1)).item() == FACTORS[version]


def test_get_kernel_from_bare_repo(hub_env: HubEnv, kernels_mod: ModuleType) -> None:
    kernel = kernels_mod.get_kernel(BARE_REPO, version=2)
    assert kernel.scale(_torch().ones(1)).item() == FACTORS[2]


def test_untrusted_org_is_refused_before_any_download(
    hub_env: HubEnv, hub_server: HubServer, kernels_mod: ModuleType
) -> None:
    with pytest.raises(ValueError, match="not from a trusted publisher"):
        kernels_mod.get_kernel(UNTRUSTED_REPO, version=1)
    counts = hub_server.counts
    counts.pop("agent_harnesses", None)
    assert counts == {"org_overview": 1}
    hub_server.reset_counts()
    kernel = kernels_mod.get_kernel(UNTRUSTED_REPO, version=1, trust_remote_code=[UNTRUSTED_REPO])
    assert kernel.VERSION == 1
    assert hub_server.counts["org_overview"] == 0  # an allow-listed repo skips the check


def test_unknown_org_cannot_be_verified(
    hub_env: HubEnv, hub_server: HubServer, kernels_mod: ModuleType
) -> None:
    hub_server.set_trusted("kerneld-untrusted", None)
    with pytest.raises(ValueError, match="could not verify publisher trust"):
        kernels_mod.get_kernel("no-such-org/scale", version=1)
    assert hub_server.counts["org_overview"] == 1


def test_trust_flag_is_read_per_call(
    hub_env: HubEnv, hub_server: HubServer, kernels_mod: ModuleType
) -> None:
    hub_server.set_trusted("kerneld-untrusted", True)
    assert kernels_mod.get_kernel(UNTRUSTED_REPO, version=2).VERSION == 2


def _hub_ends_an_empty_user_agent_with_a_separator() -> bool:
    """Whether this huggingface_hub turns an empty user agent into a header that ends in "; "
    (2.4.0 does; 2.5.0 drops empty parts). `make test` installs the newest release its range
    allows, so the suite meets both."""
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(token=False, user_agent="")["user-agent"].rstrip().endswith(";")


def test_telemetry_off_and_kernels_trust_check(
    hub_env: HubEnv,
    hub_server: HubServer,
    kernels_mod: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """REFERENCE §4 known bug: with telemetry off, kernels builds an empty user agent that
    huggingface_hub up to 2.4 ends with "; " (an illegal header); the trust check swallows that
    error and reports an unverifiable publisher, and an origin appended to the user agent avoids
    it. huggingface_hub 2.5 drops the empty part: the same call then reaches the Hub with a legal
    header and loads."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_USER_AGENT_ORIGIN", None)
    if _hub_ends_an_empty_user_agent_with_a_separator():
        with pytest.raises(ValueError, match="could not verify publisher trust"):
            kernels_mod.get_kernel(REPO, version=1)
        with pytest.raises(Exception, match="Illegal header value"):
            kernels_mod.get_kernel(REPO, version=1, trust_remote_code=True)
        assert hub_server.total(exclude=()) == 0  # nothing ever left the client
    else:
        assert kernels_mod.get_kernel(REPO, version=1).VERSION == 1
        agents = [r.user_agent for r in hub_server.requests if r.kind == "org_overview"]
        assert agents, "the trust check never asked the Hub"
        assert all(a.startswith("kernels/") and not a.rstrip().endswith(";") for a in agents)
    monkeypatch.setattr(constants, "HF_HUB_USER_AGENT_ORIGIN", "kerneld-tests")
    assert kernels_mod.get_kernel(REPO, version=1).VERSION == 1


def test_synthetic_metadata_digest_is_what_kernels_computes(
    hub_env: HubEnv, kernels_mod: ModuleType
) -> None:
    """The synthetic kernel's digest uses exactly the format kernels verifies (`kernels verify`)."""
    from kernels._rust import Digest, Metadata

    folder = hub_env.api().snapshot_download(
        REPO, repo_type="kernel", revision="v1", allow_patterns=f"build/{VARIANT}/*"
    )
    variant = Path(folder) / "build" / VARIANT
    metadata = Metadata.read_from_file(variant / "metadata.json")
    assert metadata.digest is not None
    metadata.digest.validate(Digest.hash_variant(metadata.digest.algorithm, variant))
    assert set(metadata.digest.files) == {"__init__.py", "_ops.py", "layers.py", "data.bin"}


def test_offline_after_online_get_kernel_fails(
    hub_env: HubEnv,
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
    kernels_mod: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """REFERENCE §4 known bug, one reason kerneld exists: an online get_kernel leaves a cache that
    HF_HUB_OFFLINE=1 cannot use (no refs/vN file, a partial snapshot)."""
    assert kernels_mod.get_kernel(REPO, version=1).VERSION == 1
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_server.reset_counts()
    with pytest.raises(ValueError, match="not available in the local cache"):
        kernels_mod.get_kernel(REPO, version=1)
    with pytest.raises(FileNotFoundError, match="Cannot find a local snapshot"):
        kernels_mod.get_kernel(REPO, revision=synthetic_hub.commits["v1"])
    assert hub_server.total(exclude=()) == 0


def test_get_kernel_of_compiled_example(
    example_hub_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real compiled C++ example kernel (native .so, maybe as LFS) loads through the server."""
    from examples.kernels.specs import ORG

    with HubServer(example_hub_root, trusted_orgs={ORG: True}) as server:
        point_hf_at(monkeypatch, server.url, tmp_path / "hf-home")
        import kernels
        import torch

        activation = kernels.get_kernel(f"{ORG}/activation", version=1)
        x = torch.randn(4, 8)
        expected = torch.nn.functional.silu(x[:, :4]) * x[:, 4:]
        torch.testing.assert_close(activation.silu_and_mul_alloc(x), expected)
        downloaded = [r.path for r in server.requests if r.kind == "resolve_get"]
        assert any(p.endswith(".so") for p in downloaded), downloaded
        assert server.counts["org_overview"] == 1
        assert not server.errors
