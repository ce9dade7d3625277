"""The Hub-compatible test server, seen by a plain HTTP client: routes, headers, errors, Range,
pagination, counters and every fault kind. The client tests rely on all of this being right."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from tests.fixtures_hub import BARE_REPO, MANY_FILES, MANY_REPO, REPO, UNTRUSTED_ORG, SyntheticHub
from tests.support.gitrepo import GitRepo
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import KINDS, Fault

DATA = "build/torch-universal/data.bin"  # LFS-tracked
INIT = "build/torch-universal/__init__.py"  # plain git file
HUB_DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    server: HubServer,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def resolve_path(repo: str, rev: str, path: str) -> str:
    return f"/kernels/{repo}/resolve/{quote(rev, safe='')}/{path}"


# --- lifecycle ---------------------------------------------------------------------------------


def test_starts_fast_on_loopback_and_stops(hub_root: Path) -> None:
    server = HubServer(hub_root).start()
    try:
        assert server.start_seconds is not None and server.start_seconds < 0.5
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert request(server, "GET", f"/api/kernels/{REPO}/refs").status == 200
    finally:
        server.stop()
    with pytest.raises(ConnectionRefusedError):
        request(server, "GET", f"/api/kernels/{REPO}/refs")


def test_context_manager_gives_distinct_free_ports(hub_root: Path) -> None:
    with HubServer(hub_root) as a, HubServer(hub_root) as b:
        assert a.port != b.port
        assert request(a, "GET", "/api/agent-harnesses").status == 404
        assert request(b, "GET", "/api/agent-harnesses").status == 404


def test_stop_closes_idle_keepalive_connections(hub_root: Path) -> None:
    server = HubServer(hub_root).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", f"/api/kernels/{REPO}/refs")
    conn.getresponse().read()
    server.stop()
    conn.sock.settimeout(5)
    assert conn.sock.recv(1) == b""  # the server closed its end; stop() did not hang on it
    conn.close()


def test_keepalive_requests_do_not_stall(hub_server: HubServer) -> None:
    """Without disable_nagle_algorithm, each keep-alive response waits ~40 ms for delayed ACKs."""
    conn = http.client.HTTPConnection("127.0.0.1", hub_server.port, timeout=5)
    times, socks = [], set()
    for _ in range(15):
        t0 = time.perf_counter()
        conn.request("GET", f"/api/organizations/{UNTRUSTED_ORG}/overview")
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read()
        times.append(time.perf_counter() - t0)
        socks.add(id(conn.sock))
    conn.close()
    assert len(socks) == 1, "connection was not kept alive"
    assert statistics.median(times) < 0.02, times


def test_cli_serves_root(hub_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hubserver", str(hub_root), "--trust", UNTRUSTED_ORG],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        parsed = urlsplit(url)
        assert parsed.hostname == "127.0.0.1"
        conn = http.client.HTTPConnection("127.0.0.1", parsed.port, timeout=5)
        conn.request("GET", f"/api/organizations/{UNTRUSTED_ORG}/overview")
        assert json.loads(conn.getresponse().read())["trustedKernelPublisher"] is True
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=5)


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


# --- errors --------------------------------------------------------------------------------------


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


# --- counters ------------------------------------------------------------------------------------


def test_counters_by_kind_and_path(hub_server: HubServer) -> None:
    request(hub_server, "GET", f"/api/kernels/{REPO}/refs")
    request(hub_server, "GET", f"/api/kernels/{REPO}/refs")
    request(hub_server, "GET", f"/api/kernels/{REPO}/revision/v1")
    request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1")
    request(hub_server, "POST", f"/api/kernels/{REPO}/paths-info/v1", body=b"paths=README.md")
    request(hub_server, "HEAD", resolve_path(REPO, "v1", INIT))
    request(hub_server, "GET", resolve_path(REPO, "v1", INIT))
    request(hub_server, "GET", "/api/organizations/kerneld-trusted/overview")
    request(hub_server, "GET", "/api/agent-harnesses")
    assert hub_server.counts == {
        "refs": 2,
        "info": 1,
        "tree": 1,
        "paths_info": 1,
        "resolve_head": 1,
        "resolve_get": 1,
        "org_overview": 1,
        "agent_harnesses": 1,
    }
    assert set(hub_server.counts) <= set(KINDS)
    assert hub_server.total() == 8
    assert hub_server.total(exclude=()) == 9
    assert hub_server.path_counts[f"GET /api/kernels/{REPO}/refs"] == 2
    assert hub_server.path_counts[f"HEAD /kernels/{REPO}/resolve/v1/{INIT}"] == 1
    assert [r.status for r in hub_server.requests][-1] == 404
    hub_server.reset_counts()
    assert hub_server.counts == {}
    assert hub_server.total() == 0
    assert hub_server.requests == []


def test_reset_restores_construction_state(hub_root: Path) -> None:
    with HubServer(hub_root, trusted_orgs={"a": True}, page_size=5, latency_s=0.01) as server:
        server.set_trusted("a", False)
        server.page_size, server.expand_page_size, server.latency_s = 1, 2, 3.0
        server.gated.add(REPO)
        server.inject(Fault(pattern="*", kind="error"))
        server.reset()
        assert (server.trusted_orgs, server.page_size, server.expand_page_size) == (
            {"a": True},
            5,
            50,
        )
        assert server.latency_s == 0.01
        assert server.gated == set()
        assert request(server, "GET", f"/api/kernels/{REPO}/refs").status == 200
        assert server.counts == {"refs": 1}


def test_counters_are_thread_safe(hub_server: HubServer) -> None:
    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", hub_server.port, timeout=10)
        for _ in range(25):
            conn.request("GET", f"/api/organizations/{UNTRUSTED_ORG}/overview")
            conn.getresponse().read()
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hub_server.counts["org_overview"] == 200
    assert len(hub_server.requests) == 200


# --- faults --------------------------------------------------------------------------------------


def test_fault_latency_once_and_global_latency(hub_server: HubServer) -> None:
    fault = hub_server.inject(Fault(pattern="*/refs", kind="latency", latency_s=0.2, times=1))
    path = f"/api/kernels/{REPO}/refs"
    t0 = time.perf_counter()
    assert request(hub_server, "GET", path).status == 200
    slow = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert request(hub_server, "GET", path).status == 200
    fast = time.perf_counter() - t0
    assert slow >= 0.2
    assert fast < 0.15
    assert fault.fired == 1 and fault.exhausted
    hub_server.latency_s = 0.05
    t0 = time.perf_counter()
    request(hub_server, "GET", "/api/agent-harnesses")
    assert time.perf_counter() - t0 >= 0.05


def test_fault_http_500_n_times(hub_server: HubServer) -> None:
    fault = hub_server.inject(Fault(pattern=f"/api/kernels/{REPO}/refs", kind="error", times=2))
    statuses = [request(hub_server, "GET", f"/api/kernels/{REPO}/refs").status for _ in range(3)]
    assert statuses == [500, 500, 200]
    assert fault.fired == 2
    assert hub_server.counts["refs"] == 3  # faulted requests are counted too


def test_fault_rate_limit_has_retry_after(hub_server: HubServer) -> None:
    hub_server.inject(Fault(pattern="*/resolve/*", kind="rate_limit", retry_after=7, method="HEAD"))
    head = request(hub_server, "HEAD", resolve_path(REPO, "v1", INIT))
    assert head.status == 429
    assert head.headers["Retry-After"] == "7"
    assert request(hub_server, "GET", resolve_path(REPO, "v1", INIT)).status == 200  # method filter


def test_fault_regex_pattern_and_clear(hub_server: HubServer) -> None:
    hub_server.inject(Fault(pattern=r"/tree/[^/]+$", kind="error", status=503, regex=True))
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1").status == 503
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1/build").status == 200
    hub_server.clear_faults()
    assert request(hub_server, "GET", f"/api/kernels/{REPO}/tree/v1").status == 200


def _get_data(server: HubServer) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", resolve_path(REPO, "v1", DATA))
    return conn.getresponse(), conn


def test_fault_reset_mid_body(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    fault = hub_server.inject(Fault(pattern="*/data.bin", kind="reset", times=1))
    assert request(hub_server, "HEAD", resolve_path(REPO, "v1", DATA)).status == 200
    assert fault.fired == 0  # body faults never fire on HEAD
    resp, conn = _get_data(hub_server)
    assert resp.status == 200
    with pytest.raises(ConnectionResetError):
        resp.read()
    conn.close()
    assert fault.fired == 1
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    assert request(hub_server, "GET", resolve_path(REPO, "v1", DATA)).body == content


def test_fault_truncated_body(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    hub_server.inject(Fault(pattern="*/data.bin", kind="truncate", times=1))
    resp, conn = _get_data(hub_server)
    assert resp.headers["Content-Length"] == str(len(content))
    with pytest.raises(http.client.IncompleteRead) as err:
        resp.read()
    conn.close()
    assert err.value.partial == content[: len(content) // 2]


def test_fault_corrupt_flips_one_byte(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    content = synthetic_hub.files[synthetic_hub.commits["v1"]][DATA]
    hub_server.inject(Fault(pattern="*/data.bin", kind="corrupt", times=1, corrupt_offset=123))
    body = request(hub_server, "GET", resolve_path(REPO, "v1", DATA)).body
    assert len(body) == len(content)
    diff = [i for i, (a, b) in enumerate(zip(body, content, strict=True)) if a != b]
    assert diff == [123]
    assert body[123] == content[123] ^ 0xFF
    assert request(hub_server, "GET", resolve_path(REPO, "v1", DATA)).body == content


def test_fault_without_times_fires_forever(hub_server: HubServer) -> None:
    fault = hub_server.inject(Fault(pattern="*/overview", kind="error", status=502))
    for _ in range(4):
        assert request(hub_server, "GET", "/api/organizations/x/overview").status == 502
    assert fault.fired == 4
    assert not fault.exhausted


# --- rate budget and byte counters (bench scenario 2) -----------------------------------------


def test_rate_budget_answers_429_with_retry_after_then_reopens(
    hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    budget = hub_server.set_rate_budget(2, window_s=1.0)
    assert budget is not None
    path = f"/api/kernels/{REPO}/refs"
    assert [request(hub_server, "GET", path).status for _ in range(2)] == [200, 200]
    refused = request(hub_server, "GET", path)
    assert refused.status == 429 and refused.headers["Retry-After"] == "1"
    assert budget.refused == 1
    time.sleep(1.05)  # the window is over: a new budget
    assert request(hub_server, "GET", path).status == 200
    hub_server.reset()
    assert all(request(hub_server, "GET", path).status == 200 for _ in range(4))


def test_bytes_sent_are_counted_by_kind(hub_server: HubServer, synthetic_hub: SyntheticHub) -> None:
    body = request(hub_server, "GET", resolve_path(REPO, "v1", INIT)).body
    assert hub_server.bytes_sent["resolve_get"] == len(body) > 0
    assert hub_server.total_bytes() == len(body), hub_server.records
