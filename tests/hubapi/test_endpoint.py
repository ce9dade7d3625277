"""The daemon's Hub API endpoint, read by the real `huggingface_hub` client: the same answers as
the Hub itself for a kernel's build tree, one upstream download per host, warm answers with the
Hub silent or down, the Hub's error shapes, and no more access than the user socket gives."""

from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT, http_get_unix, metric
from tests.fixtures_hub import REPO, UNTRUSTED_REPO, VARIANT, SyntheticHub, snapshot_files
from tests.hubapi.support import endpoint_of, hub_api_daemon
from tests.security.support import as_user, nobody_kept_out
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def _api(endpoint: str) -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=False)


def _build_listing(api: Any, revision: str) -> list[tuple[str, Any, Any, Any]]:
    """The recursive listing of build/, as huggingface_hub parses it (folder ids aside)."""
    from huggingface_hub.hf_api import RepoFile

    entries = api.list_repo_tree(
        REPO, "build", repo_type="kernel", revision=revision, recursive=True
    )
    return sorted(
        (e.path, e.blob_id, e.size, e.lfs) if isinstance(e, RepoFile) else (e.path, None, 0, None)
        for e in entries
    )


def _snapshot(endpoint: str, cache: Path, revision: str = "v1") -> dict[str, bytes]:
    folder = _api(endpoint).snapshot_download(
        REPO,
        repo_type="kernel",
        revision=revision,
        allow_patterns=[f"build/{VARIANT}/*"],
        cache_dir=cache,
    )
    return snapshot_files(Path(folder))


def test_huggingface_hub_sees_the_kernel_as_on_the_hub_and_the_hub_sees_one_download(
    make_daemon: Callable[..., DaemonProcess],
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
    tmp_path: Path,
) -> None:
    d, endpoint = hub_api_daemon(make_daemon, hub_endpoint=hub_server.url)
    api, hub = _api(endpoint), _api(hub_server.url)

    # Refs, revisions and the build tree read exactly as on the Hub (ids, sizes, LFS info).
    ours = api.list_repo_refs(REPO, repo_type="kernel")
    theirs = hub.list_repo_refs(REPO, repo_type="kernel")
    assert (ours.branches, ours.tags) == (theirs.branches, theirs.tags)
    for rev in ("v1", "v2", "main", synthetic_hub.commits["v1"]):
        info = api.repo_info(REPO, repo_type="kernel", revision=rev)
        assert info.sha == synthetic_hub.commits.get(rev, rev)
        assert _build_listing(api, rev) == _build_listing(hub, rev)
    info = api.repo_info(REPO, repo_type="kernel", revision="v1", files_metadata=True)
    assert {s["rfilename"] for s in info.siblings} == set(synthetic_hub.variant_files("v1"))

    # Cold: many processes at once, each with its own cache; the daemon downloads once.
    hub_server.reset_counts()
    results: dict[int, dict[str, bytes]] = {}

    def one(i: int) -> None:
        results[i] = _snapshot(endpoint, tmp_path / f"cold-{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8
    assert all(r == synthetic_hub.variant_files("v1") for r in results.values())
    files = len(synthetic_hub.variant_files("v1"))
    assert hub_server.counts["resolve_get"] == files, dict(hub_server.counts)

    # Warm: a new process with an empty cache costs the Hub nothing.
    hub_server.reset_counts()
    assert _snapshot(endpoint, tmp_path / "warm") == synthetic_hub.variant_files("v1")
    assert hub_server.total() == 0, hub_server.requests

    # The Hub down, the daemon restarted (no memory of the Hub's answers): still served.
    hub_server.inject(Fault("*", "error", status=503))
    d.restart()
    endpoint = endpoint_of(d)
    assert _snapshot(endpoint, tmp_path / "down") == synthetic_hub.variant_files("v1")
    refs = _api(endpoint).list_repo_refs(REPO, repo_type="kernel")
    assert (refs.branches, refs.tags) == (theirs.branches, theirs.tags)  # the last listing
    with pytest.raises(Exception, match="503"):  # never fetched: the outage is the answer
        _snapshot(endpoint, tmp_path / "v2", revision="v2")


def _request(
    endpoint: str, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_file_answers_carry_what_clients_check_and_ranges_work(
    make_daemon: Callable[..., DaemonProcess],
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
) -> None:
    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=hub_server.url)
    commit = synthetic_hub.commits["v1"]
    for name in ("data.bin", "metadata.json"):  # an LFS file and a plain git blob
        path = f"/kernels/{REPO}/resolve/v1/build/{VARIANT}/{name}"
        data = synthetic_hub.variant_files("v1")[f"build/{VARIANT}/{name}"]
        mine = _request(endpoint, "HEAD", path)
        hubs = _request(hub_server.url, "HEAD", path)
        assert mine[0] == hubs[0] == 200
        for header in ("X-Repo-Commit", "ETag", "X-Linked-Etag", "X-Linked-Size", "Content-Length"):
            assert mine[1].get(header) == hubs[1].get(header), header
        assert mine[1]["X-Repo-Commit"] == commit
        status, headers, body = _request(endpoint, "GET", path)
        assert (status, body) == (200, data)
        status, headers, body = _request(endpoint, "GET", path, {"Range": "bytes=10-19"})
        assert (status, body) == (206, data[10:20])
        assert headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        status, _, body = _request(endpoint, "GET", path, {"Range": "bytes=-5"})
        assert (status, body) == (206, data[-5:])
        status, headers, _ = _request(endpoint, "GET", path, {"Range": f"bytes={len(data)}-"})
        assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"


def test_errors_have_the_hubs_shapes_and_say_what_to_do(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, tmp_path: Path
) -> None:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub_server.set_trusted(UNTRUSTED_REPO.split("/")[0], False)
    d, endpoint = hub_api_daemon(
        make_daemon,
        hub_endpoint=hub_server.url,
        config={"trust": {"allow": ["kerneld-trusted/*"]}},
    )
    api = _api(endpoint)
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("kerneld-trusted/no-such-kernel", repo_type="kernel")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(REPO, repo_type="kernel", revision="v99")
    with pytest.raises(EntryNotFoundError):
        api.hf_hub_download(
            REPO, "README.md", repo_type="kernel", revision="v1", cache_dir=tmp_path
        )
    with pytest.raises(EntryNotFoundError):
        api.hf_hub_download(
            REPO, "build/no-variant/x.py", repo_type="kernel", revision="v1", cache_dir=tmp_path
        )
    with pytest.raises(HfHubHTTPError, match="not a trusted|trusted publisher") as untrusted:
        api.repo_info(UNTRUSTED_REPO, repo_type="kernel", revision="v1")
    assert untrusted.value.response.status_code == 403

    with d.admin() as admin:
        admin.Deny(pb.DenyRequest(repo_id=REPO, reason="advisory 7"), timeout=TIMEOUT)
    hub_server.reset_counts()
    with pytest.raises(HfHubHTTPError, match="advisory 7") as denied:
        api.repo_info(REPO, repo_type="kernel", revision="v1")
    assert denied.value.response.status_code == 403
    assert "kerneldctl allow" in str(denied.value)
    # snapshot_download wraps it (as any 403 of the Hub) but keeps the words.
    with pytest.raises(Exception, match="denied by the administrator: advisory 7"):
        _snapshot(endpoint, tmp_path / "denied")
    assert hub_server.total() == 0  # a denied kernel is never fetched

    # Read-only, kernels only: writes are refused, model/dataset routes are not served.
    status, _, _ = _request(endpoint, "POST", f"/kernels/{REPO}/resolve/v1/build/x")
    assert status == 405
    status, headers, _ = _request(endpoint, "GET", f"/api/models/{REPO}")
    assert status == 404 and headers["X-Error-Code"] == "RepoNotFound"
    status, _, body = _request(endpoint, "DELETE", f"/api/kernels/{REPO}")
    assert status == 405 and b"read-only" in body


@needs_root
def test_the_endpoint_admits_exactly_the_users_of_the_user_socket(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer
) -> None:
    """A loopback port has no file mode: the daemon finds each connection's uid in the
    kernel's socket table and applies the user socket's mode and group to it (the uid's groups
    by the user database). The unix socket endpoint gets the user socket's mode and group."""
    group = "kerneld-users"  # the daemon is a member, as in the unit
    sock_dir = daemon_dir("kd-hub-")
    d, endpoint = hub_api_daemon(
        make_daemon,
        hub_endpoint=hub_server.url,
        config={
            "sockets": {"user_mode": "0660", "user_group": group},
            "hub_api": {"socket": str(sock_dir / "hub.sock")},
        },
    )
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    nobody = pwd.getpwnam("nobody")
    members = grp.getgrnam(group).gr_gid

    def tcp_status() -> list[Any]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", f"/api/kernels/{REPO}/revision/v1")
        resp = conn.getresponse()
        return [resp.status, resp.getheader("X-Error-Message") or ""]

    def unix_status() -> str:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(sock_dir / "hub.sock"))
            except PermissionError:
                return "EACCES"
            s.sendall(f"GET /api/kernels/{REPO}/refs HTTP/1.0\r\n\r\n".encode())
            return s.recv(64).split(b"\r\n", 1)[0].decode()

    status, message = as_user(nobody.pw_uid, nobody.pw_gid, tcp_status)
    assert status == 403 and f"uid {nobody.pw_uid} may not use" in message, message
    assert group in message
    assert as_user(nobody.pw_uid, nobody.pw_gid, unix_status) == "EACCES"
    assert "refused" in d.logs()
    # A member of the socket's group gets answers on both.
    assert as_user(nobody.pw_uid, members, unix_status).endswith("200 OK")
    with nobody_kept_out(admit=True):  # the attack tests' outsider is `nobody`
        subprocess.run(["gpasswd", "-a", "nobody", group], check=True, capture_output=True)
        try:
            status, message = as_user(nobody.pw_uid, nobody.pw_gid, tcp_status)
            assert status == 200, message
        finally:
            subprocess.run(["gpasswd", "-d", "nobody", group], check=True, capture_output=True)


def test_requests_are_counted_by_route_and_status(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer
) -> None:
    metrics_sock = daemon_dir("kd-m-") / "metrics.sock"
    _, endpoint = hub_api_daemon(
        make_daemon, hub_endpoint=hub_server.url, config={"metrics": {"socket": str(metrics_sock)}}
    )
    _request(endpoint, "GET", f"/api/kernels/{REPO}/refs")
    _request(endpoint, "GET", f"/api/kernels/{REPO}/revision/v99")
    text = http_get_unix(metrics_sock)
    assert metric(text, "kerneld_hub_api_requests_total", route="refs", status="200") == 1
    assert metric(text, "kerneld_hub_api_requests_total", route="info", status="404") == 1
    body = json.loads(_request(endpoint, "GET", f"/api/kernels/{REPO}/refs")[2])
    assert {b["name"] for b in body["branches"]} >= {"v1", "v2", "main"}


@pytest.mark.olah
def test_olah_mirrors_the_endpoint_as_it_mirrors_the_hub(
    make_daemon: Callable[..., DaemonProcess],
    hub_server: HubServer,
    synthetic_hub: SyntheticHub,
    tmp_path: Path,
) -> None:
    """A third-party Hub implementation reads our answers: olah, pull-through in front of the
    endpoint (it probes with HEAD on API routes, follows listings and downloads files), serves
    the kernel to huggingface_hub as the Hub would."""
    from tests.support.olah import run_olah

    _, endpoint = hub_api_daemon(make_daemon, hub_endpoint=hub_server.url)
    work = tmp_path / "olah"
    work.mkdir()
    with run_olah(work, probe_repo=REPO, upstream=endpoint) as olah:
        assert _snapshot(olah.url, tmp_path / "via-olah") == synthetic_hub.variant_files("v1")
        assert _build_listing(_api(olah.url), "v1") == _build_listing(_api(hub_server.url), "v1")


def test_status_says_where_the_endpoint_is(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, tmp_path: Path
) -> None:
    from tests.support.ctl import run_ctl

    d, endpoint = hub_api_daemon(make_daemon, hub_endpoint=hub_server.url)
    with d.kernels() as kernels:
        assert list(kernels.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT).hub_api) == [endpoint]
    env = {"KERNELD_SOCKET": str(d.user_socket), "KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
    shown = run_ctl("status", home=tmp_path / "home", env=env)
    assert shown.rc == 0, shown
    assert f"hub api: {endpoint} (HF_ENDPOINT for unmodified kernels)" in shown.stdout
    doc = run_ctl("status", "--json", home=tmp_path / "home", env=env).json()
    assert doc["hub_api"] == [endpoint]
