"""The test Hub's routes as the Hub answers them: refs, repo info, tree listings with
pagination, paths-info, and file downloads with HEAD and Range."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from tests.fixtures_hub import BARE_REPO, MANY_FILES, MANY_REPO, REPO, SyntheticHub
from tests.hubserver.support import DATA, HUB_DATE, INIT, git_blob_sha1, request, resolve_path
from tests.support.gitrepo import GitRepo
from tests.support.hubserver import HubServer

# --- refs and repo info ---------------------------------------------------------------------------


def test_refs(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    data = request(hub_server, "GET", f"/api/kernels/{REPO}/refs").json()
    c = synthetic_hub.commits
    assert {b["name"]: b["targetCommit"] for b in data["branches"]} == {
        "main": c["main"],
        "v1": c["v1"],
        "v2": c["v2"],
        "feature/x": c["feature/x"],
    }
    assert {b["name"]: b["ref"] for b in data["branches"]}["v1"] == "refs/heads/v1"
    # the annotated tag is peeled to its commit
    assert {t["name"]: t["targetCommit"] for t in data["tags"]} == {
        "v1.0.0": c["v1"],
        "release-2": c["v2"],
    }
    assert data["converts"] == []
    assert "pullRequests" not in data
    with_prs = request(hub_server, "GET", f"/api/kernels/{REPO}/refs?include_prs=1").json()
    assert with_prs["pullRequests"] == []


def test_refs_are_read_fresh_and_new_repos_found(tmp_path: Path) -> None:
    """kerneld's ref TTL tests move branches under a running server."""
    with HubServer(tmp_path) as server:
        assert request(server, "GET", "/api/kernels/org/late/refs").status == 401
        repo = GitRepo(tmp_path / "kernels" / "org" / "late")
        first = repo.commit("one", {"a.txt": b"1"})
        repo.branch("v1")
        refs = request(server, "GET", "/api/kernels/org/late/refs").json()
        assert [b["targetCommit"] for b in refs["branches"] if b["name"] == "v1"] == [first]
        second = repo.commit("two", {"a.txt": b"2"})
        repo.branch("v1", force=True)
        refs = request(server, "GET", "/api/kernels/org/late/refs").json()
        assert [b["targetCommit"] for b in refs["branches"] if b["name"] == "v1"] == [second]
        body = request(server, "GET", resolve_path("org/late", "v1", "a.txt")).body
        assert body == b"2"


@pytest.mark.parametrize(
    ("rev", "ref"),
    [
        ("v1", "v1"),
        ("refs/heads/v1", "v1"),
        ("v1.0.0", "v1"),
        ("refs/tags/v1.0.0", "v1"),
        ("release-2", "v2"),
        ("feature/x", "feature/x"),
        ("refs/heads/feature/x", "feature/x"),
        ("main", "main"),
    ],
)
def test_info_by_revision(
    hub_server: HubServer, synthetic_hub: SyntheticHub, rev: str, ref: str
) -> None:
    resp = request(hub_server, "GET", f"/api/kernels/{REPO}/revision/{quote(rev, safe='')}")
    assert resp.status == 200
    data = resp.json()
    assert data["id"] == REPO
    assert data["sha"] == synthetic_hub.commits[ref]
    assert HUB_DATE.fullmatch(data["lastModified"])
    assert "xetHash" not in resp.body.decode()


def test_info_by_commit_and_default_branch(
    hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    c = synthetic_hub.commits
    data = request(hub_server, "GET", f"/api/kernels/{REPO}/revision/{c['v1']}").json()
    assert data["sha"] == c["v1"]
    assert data["lastModified"] == "2026-01-01T00:00:00.000Z"  # the first commit's date
    default = request(hub_server, "GET", f"/api/kernels/{REPO}").json()
    assert default["sha"] == c["main"]
    assert default["lastModified"] == "2026-01-01T00:00:02.000Z"
    assert {s["rfilename"] for s in default["siblings"]} == set(synthetic_hub.files[c["main"]])
    bare = request(hub_server, "GET", f"/api/kernels/{BARE_REPO}").json()
    assert bare["sha"] == c["main"]


# --- tree and paths-info --------------------------------------------------------------------------


def _check_file_entry(entry: dict[str, Any], content: bytes) -> None:
    if entry["path"].endswith(".bin"):
        lfs = entry["lfs"]
        assert lfs["oid"] == hashlib.sha256(content).hexdigest()
        assert lfs["size"] == entry["size"] == len(content)
        assert 100 < lfs["pointerSize"] < 200
        assert entry["oid"] != git_blob_sha1(content)  # the pointer's blob id
    else:
        assert "lfs" not in entry
        assert entry["oid"] == git_blob_sha1(content)
        assert entry["size"] == len(content)


@pytest.mark.parametrize("repo", [REPO, BARE_REPO])
def test_tree_recursive_lists_every_file_and_directory(
    hub_server: HubServer, synthetic_hub: SyntheticHub, repo: str
) -> None:
    commit = synthetic_hub.commits["v2"]
    resp = request(
        hub_server, "GET", f"/api/kernels/{repo}/tree/{commit}?recursive=true&expand=false"
    )
    assert resp.status == 200
    assert "Link" not in resp.headers
    entries = resp.json()
    files = synthetic_hub.files[commit]
    assert {e["path"] for e in entries if e["type"] == "file"} == set(files)
    assert {e["path"] for e in entries if e["type"] == "directory"} == {
        "build",
        "build/torch-universal",
    }
    for entry in entries:
        if entry["type"] == "file":
            _check_file_entry(entry, files[entry["path"]])
        else:
            assert set(entry) == {"type", "oid", "path", "size"}
    assert "xet" not in resp.body.decode().lower()


def test_tree_non_recursive_and_subpath(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    rev = quote("refs/heads/v1", safe="")
    root = request(hub_server, "GET", f"/api/kernels/{REPO}/tree/{rev}").json()
    assert {(e["type"], e["path"]) for e in root} == {
        ("file", ".gitattributes"),
        ("file", "README.md"),
        ("directory", "build"),
    }
    build = request(
        hub_server, "GET", f"/api/kernels/{REPO}/tree/{rev}/build?recursive=false"
    ).json()
    assert [(e["type"], e["path"]) for e in build] == [("directory", "build/torch-universal")]
    sub = quote("build/torch-universal", safe="")
    variant = request(hub_server, "GET", f"/api/kernels/{REPO}/tree/{rev}/{sub}").json()
    expected = synthetic_hub.variant_files("v1")
    assert {e["path"] for e in variant} == set(expected)


def test_tree_expand_reports_last_commit(
    hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    c = synthetic_hub.commits
    sub = quote("build/torch-universal", safe="")
    entries = request(hub_server, "GET", f"/api/kernels/{REPO}/tree/main/{sub}?expand=true").json()
    by_path = {e["path"]: e for e in entries}
    # layers.py is the same in v1 and v2, __init__.py changed in v2
    assert by_path["build/torch-universal/layers.py"]["lastCommit"]["id"] == c["v1"]
    assert by_path["build/torch-universal/__init__.py"]["lastCommit"]["id"] == c["v2"]
    assert by_path["build/torch-universal/__init__.py"]["lastCommit"]["title"] == "v2: scale by 3"
    assert HUB_DATE.fullmatch(by_path[f"build/torch-universal/{'layers.py'}"]["lastCommit"]["date"])
    assert by_path[INIT]["securityFileStatus"]["status"] == "safe"


def test_tree_pagination_follows_link_headers(
    hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    hub_server.page_size = 7
    path: str | None = f"/api/kernels/{MANY_REPO}/tree/main?recursive=true"
    pages: list[list[dict[str, Any]]] = []
    while path is not None:
        resp = request(hub_server, "GET", path)
        assert resp.status == 200
        pages.append(resp.json())
        link = resp.headers.get("Link")
        if link is None:
            path = None
        else:
            m = re.fullmatch(r'<(http://[^>]+)>; rel="next"', link)
            assert m is not None, link
            url = urlsplit(m.group(1))
            assert url.port == hub_server.port
            path = f"{url.path}?{url.query}"
    n_entries = MANY_FILES + 3  # and three directories
    assert [len(p) for p in pages] == [7, 7, 7, 7]
    assert len(pages) == -(-n_entries // 7)
    paths = [e["path"] for page in pages for e in page]
    assert len(paths) == len(set(paths)) == n_entries
    assert {p for p in paths if "/" in p} == set(synthetic_hub.many_files)
    assert hub_server.counts["tree"] == len(pages)


def test_paths_info(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    body = (
        b"paths=README.md&paths=build&paths=" + DATA.encode() + b"&paths=missing.txt&expand=false"
    )
    resp = request(
        hub_server,
        "POST",
        f"/api/kernels/{REPO}/paths-info/{quote('refs/heads/v2', safe='')}",
        body=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert resp.status == 200
    entries = {e["path"]: e for e in resp.json()}
    assert set(entries) == {"README.md", "build", DATA}
    assert entries["build"]["type"] == "directory"
    files = synthetic_hub.files[synthetic_hub.commits["v2"]]
    _check_file_entry(entries["README.md"], files["README.md"])
    _check_file_entry(entries[DATA], files[DATA])
    assert "lastCommit" not in entries["README.md"]


# --- resolve -------------------------------------------------------------------------------------


@pytest.mark.parametrize("repo", [REPO, BARE_REPO])
@pytest.mark.parametrize("path", [INIT, DATA])
def test_resolve_head_and_get(
    hub_server: HubServer, synthetic_hub: SyntheticHub, repo: str, path: str
) -> None:
    commit = synthetic_hub.commits["v1"]
    content = synthetic_hub.files[commit][path]
    head = request(hub_server, "HEAD", resolve_path(repo, "v1", path))
    assert head.status == 200
    assert head.body == b""
    assert head.headers["X-Repo-Commit"] == commit
    assert head.headers["Content-Length"] == str(len(content))
    assert head.headers["Accept-Ranges"] == "bytes"
    if path == DATA:
        sha256 = hashlib.sha256(content).hexdigest()
        assert head.headers["ETag"] == f'"{sha256}"'
        assert head.headers["X-Linked-Etag"] == f'"{sha256}"'
        assert head.headers["X-Linked-Size"] == str(len(content))
    else:
        assert head.headers["ETag"] == f'"{git_blob_sha1(content)}"'
        assert "X-Linked-Etag" not in head.headers
    assert not [k for k in head.headers if "xet" in k.lower()]
    get = request(hub_server, "GET", resolve_path(repo, "v1", path))
    assert get.status == 200
    assert get.body == content
    assert get.headers["ETag"] == head.headers["ETag"]


@pytest.mark.parametrize(
    ("range_header", "start", "stop"),
    [
        ("bytes=0-9", 0, 10),
        ("bytes=1000-", 1000, None),
        ("bytes=-5", -5, None),
        ("bytes=10-10", 10, 11),
    ],
)
def test_resolve_range(
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
    range_header: str,
    start: int,
    stop: int | None,
) -> None:
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    expected = content[start:stop]
    first = start if start >= 0 else len(content) + start
    resp = request(
        hub_server, "GET", resolve_path(REPO, "v1", DATA), headers={"Range": range_header}
    )
    assert resp.status == 206
    assert resp.body == expected
    assert (
        resp.headers["Content-Range"] == f"bytes {first}-{first + len(expected) - 1}/{len(content)}"
    )
    head = request(
        hub_server, "HEAD", resolve_path(REPO, "v1", DATA), headers={"Range": range_header}
    )
    assert head.status == 206
    assert head.headers["Content-Length"] == str(len(expected))


def test_resolve_unsatisfiable_range(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    size = len(synthetic_hub.files[synthetic_hub.commits["v1"]][INIT])
    resp = request(
        hub_server, "GET", resolve_path(REPO, "v1", INIT), headers={"Range": f"bytes={size}-"}
    )
    assert resp.status == 416
    assert resp.headers["Content-Range"] == f"bytes */{size}"
