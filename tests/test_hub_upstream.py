"""The Hub upstream against the Hub-compatible test server: refs, files with ids, bytes, faults."""

from __future__ import annotations

import hashlib

import pytest

from kerneld.upstream.errors import (
    EntryNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamUnavailable,
)
from kerneld.upstream.hub import HubUpstream
from kerneld.upstream.retry import RetryPolicy
from tests.fixtures_hub import BARE_REPO, REPO, VARIANT, SyntheticHub
from tests.support.hubtraffic import Fault

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, timeout=5)


@pytest.fixture
def hub(hub_server) -> HubUpstream:
    return HubUpstream(endpoint=hub_server.url, token=False, policy=FAST)


def test_refs_and_revisions(hub: HubUpstream, synthetic_hub: SyntheticHub) -> None:
    refs = hub.list_refs(REPO)
    assert refs.branches["v1"] == synthetic_hub.commits["v1"]
    assert refs.versions()[2] == synthetic_hub.commits["v2"]
    assert "v1.0.0" in refs.tags
    for rev in ("v1", "v2", "main", "v1.0.0", "refs/heads/v2", "feature/x"):
        assert (
            hub.resolve_revision(REPO, rev)
            == synthetic_hub.commits[rev.removeprefix("refs/heads/")]
        )
    with pytest.raises(RevisionNotFound):
        hub.resolve_revision(REPO, "v99")
    with pytest.raises(RepoNotFound):
        hub.list_refs("kerneld-trusted/nope")


@pytest.mark.parametrize("repo", [REPO, BARE_REPO])
def test_files_carry_verifiable_ids(
    hub: HubUpstream, synthetic_hub: SyntheticHub, repo: str
) -> None:
    commit = synthetic_hub.commits["v1"]
    assert hub.list_variants(repo, commit) == [VARIANT]
    expected = {
        p.removeprefix(f"build/{VARIANT}/"): data
        for p, data in synthetic_hub.variant_files("v1").items()
    }
    files = hub.list_files(repo, commit, VARIANT)
    assert {f.path for f in files} == set(expected)
    for f in files:
        data = expected[f.path]
        assert f.size == len(data)
        if f.sha256:  # LFS: the content sha256, never the pointer's git oid
            assert f.git_sha1 is None
            assert f.sha256 == hashlib.sha256(data).hexdigest()
        else:
            assert f.git_sha1 == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        with hub.open_file(repo, commit, VARIANT, f) as chunks:
            assert b"".join(chunks) == data
    assert any(f.sha256 for f in files), "the synthetic repo has an LFS file"


def test_range_resume(hub: HubUpstream, synthetic_hub: SyntheticHub) -> None:
    commit = synthetic_hub.commits["v1"]
    big = next(f for f in hub.list_files(REPO, commit, VARIANT) if f.path == "data.bin")
    data = synthetic_hub.variant_files("v1")[f"build/{VARIANT}/data.bin"]
    with hub.open_file(REPO, commit, VARIANT, big, offset=1000) as chunks:
        assert b"".join(chunks) == data[1000:]


def test_missing_variant(hub: HubUpstream, synthetic_hub: SyntheticHub) -> None:
    with pytest.raises(EntryNotFound):
        hub.list_files(REPO, synthetic_hub.commits["v1"], "torch-cuda")


def test_500_and_429_are_retried(hub: HubUpstream, hub_server, synthetic_hub) -> None:
    hub_server.inject(Fault("*/refs", "error", times=1))
    hub_server.inject(Fault("*/refs", "rate_limit", times=1, retry_after=0))
    assert hub.list_refs(REPO).branches["v1"] == synthetic_hub.commits["v1"]
    assert hub_server.counts["refs"] == 3


def test_persistent_failure_is_unavailable(hub: HubUpstream, hub_server) -> None:
    hub_server.inject(Fault("*/refs", "error"))
    with pytest.raises(UpstreamUnavailable, match="after 3 attempts"):
        hub.list_refs(REPO)
    assert hub_server.counts["refs"] == 3


def test_long_retry_after_gives_up_at_once(hub_server) -> None:
    hub = HubUpstream(endpoint=hub_server.url, token=False, policy=RetryPolicy(max_retry_after=1))
    hub_server.inject(Fault("*/refs", "rate_limit", retry_after=3600))
    with pytest.raises(UpstreamUnavailable):
        hub.list_refs(REPO)
    assert hub_server.counts["refs"] == 1


def test_dead_endpoint_is_unavailable() -> None:
    hub = HubUpstream(endpoint="http://127.0.0.1:9", token=False, policy=FAST)
    with pytest.raises(UpstreamUnavailable):
        hub.list_refs(REPO)


def test_telemetry_disabled_still_works(hub_server, monkeypatch, synthetic_hub) -> None:
    """kernels 0.17.2 breaks with HF_HUB_DISABLE_TELEMETRY=1 (REFERENCE §4); kerneld must not."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.delenv("HF_HUB_USER_AGENT_ORIGIN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_USER_AGENT_ORIGIN", None)
    hub = HubUpstream(endpoint=hub_server.url, token=False, policy=FAST)
    assert hub.list_refs(REPO).branches["v1"] == synthetic_hub.commits["v1"]
    commit = synthetic_hub.commits["v1"]
    f = hub.list_files(REPO, commit, VARIANT)[0]
    with hub.open_file(REPO, commit, VARIANT, f) as chunks:
        assert b"".join(chunks)


def test_an_endless_tree_listing_is_cut_off(
    hub: HubUpstream, hub_server, synthetic_hub: SyntheticHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that keeps paging (`Link: next`) is refused after MAX_TREE_ENTRIES entries,
    without reading the rest: here one entry per page, a cap of 2."""
    import kerneld.upstream.hub as hub_mod
    from kerneld.upstream.errors import UpstreamProtocolError

    commit = synthetic_hub.commits["v1"]
    n = len(hub.list_files(REPO, commit, VARIANT))
    assert n > 3
    monkeypatch.setattr(hub_mod, "MAX_TREE_ENTRIES", 2)
    hub_server.page_size = 1
    before = hub_server.counts["tree"]
    with pytest.raises(UpstreamProtocolError, match="more than 2 entries"):
        hub.list_files(REPO, commit, VARIANT)
    assert hub_server.counts["tree"] - before <= 3 < n  # stopped paging


def test_a_revision_without_builds_says_so(tmp_path) -> None:
    """Issue 18: `kernels` says "build does not exist on main"; huggingface_hub's own words
    were "404 Client Error." with nothing about what is missing."""
    from tests.support.gitrepo import GitRepo
    from tests.support.hubserver import HubServer

    repo = GitRepo(tmp_path / "kernels" / "kerneld-test" / "docs-only")
    commit = repo.commit("docs", {"README.md": b"no builds yet\n"})
    with HubServer(tmp_path) as server:
        hub = HubUpstream(endpoint=server.url, token=False, policy=FAST)
        with pytest.raises(EntryNotFound) as exc:
            hub.list_variants("kerneld-test/docs-only", commit)
    assert "build does not exist on this revision" in str(exc.value)
    assert exc.value.revision == commit and exc.value.upstream == "hub"
