"""Cross-check against olah, an independent self-hosted Hub mirror, over the same git repos: where
both answer, they must agree with each other and with the real clients. This guards against our
test server and our tests sharing one misunderstanding of the Hub API."""

from __future__ import annotations

import hashlib
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest
from huggingface_hub.hf_api import RepoFile

from tests.fixtures_hub import (
    BARE_REPO,
    FACTORS,
    REPO,
    VARIANT,
    HubEnv,
    SyntheticHub,
    point_hf_at,
    snapshot_files,
)
from tests.support.hubserver import HubServer
from tests.support.olah import Olah, run_olah

pytestmark = pytest.mark.olah

DATA = f"build/{VARIANT}/data.bin"
INIT = f"build/{VARIANT}/__init__.py"


@pytest.fixture(scope="module")
def olah(hub_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Olah]:
    """olah in offline mode on 127.0.0.1, serving hub_root's repos as local mirrors."""
    with run_olah(tmp_path_factory.mktemp("olah"), probe_repo=REPO, mirrors=hub_root) as server:
        yield server


@pytest.fixture
def olah_env(olah: Olah, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubEnv:
    return point_hf_at(monkeypatch, olah.url, tmp_path / "hf-olah")


def _get(url: str, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    parsed = urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_olah_is_ready_quickly(olah: Olah) -> None:
    assert olah.ready_seconds < 10, olah.ready_seconds
    assert urlsplit(olah.url).hostname == "127.0.0.1"


def test_refs_agree(olah: Olah, hub_server: HubServer) -> None:
    ours = json.loads(_get(hub_server.url, f"/api/kernels/{REPO}/refs")[2])
    theirs = json.loads(_get(olah.url, f"/api/kernels/{REPO}/refs")[2])
    for group in ("branches", "tags", "converts"):
        key = lambda r: r["ref"]  # noqa: E731
        assert sorted(ours[group], key=key) == sorted(theirs[group], key=key), group


def test_recursive_tree_agrees(
    olah_env: HubEnv, hub_server: HubServer, synthetic_hub: SyntheticHub, tmp_path: Path
) -> None:
    ours_env = HubEnv(endpoint=hub_server.url, hf_home=tmp_path, cache_dir=tmp_path)

    def summary(env: HubEnv) -> dict[str, tuple[object, ...]]:
        out: dict[str, tuple[object, ...]] = {}
        for item in env.api().list_repo_tree(
            REPO, repo_type="kernel", revision="v2", recursive=True
        ):
            if isinstance(item, RepoFile):
                lfs = (item.lfs.sha256, item.lfs.size) if item.lfs else None
                out[item.path] = ("file", item.blob_id, item.size, lfs)
            else:
                out[item.path] = ("directory", item.tree_id)
        return out

    ours = summary(ours_env)
    assert ours == summary(olah_env)
    files = synthetic_hub.files[synthetic_hub.commits["v2"]]
    assert {p for p, s in ours.items() if s[0] == "file"} == set(files)


def test_head_headers_agree(olah: Olah, hub_server: HubServer) -> None:
    for path in (INIT, DATA):
        route = f"/kernels/{REPO}/resolve/v1/{path}"
        s1, ours, _ = _get(hub_server.url, route, "HEAD")
        s2, theirs, _ = _get(olah.url, route, "HEAD")
        assert s1 == s2 == 200
        assert ours["x-repo-commit"] == theirs["x-repo-commit"]
        assert ours["etag"].strip('"') == theirs["etag"].strip('"')
        assert ours["content-length"] == theirs["content-length"]


def test_hf_hub_download_through_olah(olah_env: HubEnv, synthetic_hub: SyntheticHub) -> None:
    commit = synthetic_hub.commits["v1"]
    api = olah_env.api()
    for path in (INIT, DATA):
        local = api.hf_hub_download(REPO, path, repo_type="kernel", revision="v1")
        assert Path(local).read_bytes() == synthetic_hub.files[commit][path]
        assert f"/snapshots/{commit}/" in local
    blob = Path(api.hf_hub_download(REPO, DATA, repo_type="kernel", revision=commit)).resolve()
    assert blob.name == hashlib.sha256(synthetic_hub.files[commit][DATA]).hexdigest()


def test_snapshot_download_through_olah(olah_env: HubEnv, synthetic_hub: SyntheticHub) -> None:
    folder = olah_env.api().snapshot_download(
        REPO, repo_type="kernel", revision="v2", allow_patterns=f"build/{VARIANT}/*"
    )
    assert Path(folder).name == synthetic_hub.commits["v2"]
    assert snapshot_files(Path(folder)) == synthetic_hub.variant_files("v2")


def test_get_kernel_through_olah_needs_trust_remote_code(olah_env: HubEnv) -> None:
    """olah has no org overview route, so the default trust check cannot pass there."""
    import kernels
    import torch

    status, headers, _ = _get(olah_env.endpoint, "/api/organizations/kerneld-trusted/overview")
    assert status == 401 and headers.get("x-error-code") == "RepoNotFound"
    with pytest.raises(ValueError, match="could not verify publisher trust"):
        kernels.get_kernel(REPO, version=1)
    kernel: ModuleType = kernels.get_kernel(REPO, version=1, trust_remote_code=True)
    assert kernel.VERSION == 1
    assert kernel.scale(torch.ones(2)).tolist() == [FACTORS[1]] * 2


def test_a_daemon_behind_olah_names_the_route_that_cannot_vouch_for_publishers(
    olah_env: HubEnv,
) -> None:
    """kerneld's Hub upstream over olah: the publisher question fails with the route and its
    status and says what to do, not "no such kernel repository"."""
    from kerneld.upstream.errors import UpstreamProtocolError
    from kerneld.upstream.hub import HubUpstream

    upstream = HubUpstream(endpoint=olah_env.endpoint, token=False)
    with pytest.raises(UpstreamProtocolError) as failed:
        upstream.publisher_trusted("kerneld-trusted")
    message = str(failed.value)
    assert "/api/organizations/kerneld-trusted/overview answered HTTP 401" in message
    assert "[trust] allow" in message and "no such kernel repository" not in message


@pytest.mark.parametrize(
    ("method", "route", "ours", "olahs"),
    [
        # a missing file: EntryNotFound (404) from us and the Hub; olah: 401 on HEAD, 500 on GET
        ("HEAD", f"/kernels/{REPO}/resolve/v1/nope.txt", 404, 401),
        ("GET", f"/kernels/{REPO}/resolve/v1/nope.txt", 404, 500),
        # a missing revision
        ("GET", f"/api/kernels/{REPO}/revision/v99", 404, 401),
        # repo info without a revision (the default branch)
        ("GET", f"/api/kernels/{REPO}", 200, 401),
        # a quoted revision containing "/"
        ("GET", f"/api/kernels/{REPO}/revision/refs%2Fheads%2Fv1", 200, 404),
        # LFS objects of a bare repo
        ("HEAD", f"/kernels/{BARE_REPO}/resolve/v1/{DATA}", 200, 500),
    ],
)
def test_known_olah_differences(
    olah: Olah, hub_server: HubServer, method: str, route: str, ours: int, olahs: int
) -> None:
    """REFERENCE.md §4 lists these olah 0.5.4 gaps; if one closes, update REFERENCE and this."""
    assert _get(hub_server.url, route, method)[0] == ours
    assert _get(olah.url, route, method)[0] == olahs
