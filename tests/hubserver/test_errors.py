"""The test Hub's error answers as the Hub sends them: missing repos, revisions and entries,
gated repos, the organization trust probe and unknown routes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures_hub import REPO, UNTRUSTED_ORG, SyntheticHub
from tests.hubserver.support import INIT, request, resolve_path
from tests.support.hubserver import HubServer


@pytest.mark.parametrize(
    "path",
    [
        "/api/kernels/nobody/nothing/refs",
        "/api/kernels/nobody/nothing",
        "/api/kernels/nobody/nothing/revision/main",
        "/api/kernels/nobody/nothing/tree/main",
        resolve_path("nobody/nothing", "main", "README.md"),
    ],
)
def test_missing_repo_is_401_repo_not_found(hub_server: HubServer, path: str) -> None:
    resp = request(hub_server, "GET", path)
    assert resp.status == 401
    assert resp.headers["X-Error-Code"] == "RepoNotFound"


@pytest.mark.parametrize(
    "path",
    [
        f"/api/kernels/{REPO}/revision/v99",
        f"/api/kernels/{REPO}/tree/v99",
        f"/api/kernels/{REPO}/tree/{'0' * 40}",
        resolve_path(REPO, "v99", "README.md"),
        resolve_path(REPO, "0" * 40, "README.md"),
    ],
)
def test_missing_revision_is_404_revision_not_found(hub_server: HubServer, path: str) -> None:
    for method in ("GET", "HEAD"):
        if method == "HEAD" and "/resolve/" not in path:
            continue
        resp = request(hub_server, method, path)
        assert resp.status == 404
        assert resp.headers["X-Error-Code"] == "RevisionNotFound"


@pytest.mark.parametrize(
    "path",
    [
        resolve_path(REPO, "v1", "build/torch-universal/missing.py"),
        resolve_path(REPO, "v1", "build/torch-universal"),  # a directory is no file
        f"/api/kernels/{REPO}/tree/v1/nowhere",
    ],
)
def test_missing_entry_is_404_with_commit(
    hub_server: HubServer, synthetic_hub: SyntheticHub, path: str
) -> None:
    for method in ("GET", "HEAD") if "/resolve/" in path else ("GET",):
        resp = request(hub_server, method, path)
        assert resp.status == 404
        assert resp.headers["X-Error-Code"] == "EntryNotFound"
        assert resp.headers["X-Repo-Commit"] == synthetic_hub.commits["v1"]


def test_gated_repo(hub_server: HubServer) -> None:
    hub_server.gated.add(REPO)
    resp = request(hub_server, "HEAD", resolve_path(REPO, "v1", INIT))
    assert resp.status == 401
    assert resp.headers["X-Error-Code"] == "GatedRepo"
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/refs").status == 200
    hub_server.gated.clear()
    assert request(hub_server, "HEAD", resolve_path(REPO, "v1", INIT)).status == 200


def test_org_overview_trust(hub_server: HubServer) -> None:
    def trusted(org: str) -> Any:
        resp = request(hub_server, "GET", f"/api/organizations/{org}/overview")
        return resp.json()["trustedKernelPublisher"] if resp.status == 200 else resp.status

    assert trusted("kerneld-trusted") is True
    assert trusted(UNTRUSTED_ORG) is False
    assert trusted("no-such-org") == 404
    hub_server.set_trusted(UNTRUSTED_ORG, True)
    hub_server.set_trusted("no-such-org", False)
    assert trusted(UNTRUSTED_ORG) is True
    assert trusted("no-such-org") is False
    hub_server.set_trusted("no-such-org", None)
    assert trusted("no-such-org") == 404


def test_agent_harnesses_and_unknown_routes_are_404(hub_server: HubServer) -> None:
    assert request(hub_server, "GET", "/api/agent-harnesses").status == 404
    assert request(hub_server, "GET", "/api/models/a/b").status == 404
    assert request(hub_server, "GET", "/").status == 404
    assert request(hub_server, "POST", f"/kernels/{REPO}/resolve/v1/README.md").status == 405
    assert hub_server.counts["agent_harnesses"] == 1
    assert hub_server.counts["other"] == 2
