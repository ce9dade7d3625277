"""Issue 41: one gate for every route. Each policy gives the same verdict on every front end
that can reach a kernel: the RPC path (`kerneld_client.get_kernel`, cold), the warm path (the
published index), the hook (`kernels.get_kernel` with KERNELD_HOOK_KERNELS=1), the Hub API
endpoint (what unmodified `kernels` asks with HF_ENDPOINT) and `kerneldctl prefetch`; a deny
also on the mirror import, for every spelling of a repo id and every name of a commit (52).

A real daemon (as its unprivileged user) over the Hub test server (case-insensitive, as the
Hub) serves one trusted organisation's signed and unsigned kernel, an untrusted organisation's
kernel and two kernels to deny; callers are real processes, the endpoint's of real users
(`nobody`) where the policy is about who asks. The hook's `kernels` talks to the same Hub test
server, so a refusal that fell through to `kernels`' own download would be served: the verdict
must come from kerneld.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import failure, resolve_req
from tests.hubapi.support import endpoint_of, hub_api_daemon
from tests.security.support import CPU_FACTS, NOBODY, as_user, needs_root
from tests.support.ctl import run_ctl
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.gitrepo import GitRepo, kernel_variant_files
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault
from tests.support.sigstore_local import LocalSigstore, Signer

ORG, OTHER = "gate-trusted", "gate-untrusted"
SIGNED, UNSIGNED, UNTRUSTED = f"{ORG}/signed", f"{ORG}/unsigned", f"{OTHER}/kernel"
#: Issue 52's denies: a repo the Hub also answers as `goodcorp/DenyMe` or `GoodCorp/denyme`,
#: and one whose commit `main`, the `v1` branch and the `release-1` tag all name.
DENYME, BYREF = "goodcorp/denyme", "goodcorp/other"
CASE_VARIANTS = ("goodcorp/DenyMe", "GoodCorp/denyme")
TAG = "release-1"
VARIANT = "torch-universal"
SIGNER = Signer()
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def sigstore() -> LocalSigstore:
    return LocalSigstore()


@pytest.fixture(scope="module")
def hub(sigstore: LocalSigstore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The Hub test server as case-insensitive as the real Hub (`Org/Name` is `org/name`)."""
    root = tmp_path_factory.mktemp("gate-hub")
    for repo, signed in (
        (SIGNED, True),
        (UNSIGNED, False),
        (UNTRUSTED, True),
        (DENYME, True),
        (BYREF, True),
    ):
        name = repo.split("/")[1]
        files = kernel_variant_files(name=name, version=1, factor=2.0, variant=VARIANT)
        if signed:
            meta = files[f"build/{VARIANT}/metadata.json"]
            files[f"build/{VARIANT}/metadata.json.sigstore"] = sigstore.sign(meta, SIGNER)
        git = GitRepo(root / "kernels" / repo)
        git.commit("v1", files)
        git.branch("v1")
        if repo == BYREF:
            git.tag(TAG)
    trusted = {ORG: True, OTHER: False, "goodcorp": True}
    with HubServer(root, trusted_orgs=trusted, case_insensitive=True) as server:
        yield server


@pytest.fixture(scope="module")
def byref_commit(hub: HubServer) -> str:
    """The one commit `main`, `v1` and the tag of BYREF name."""
    return GitRepo(hub.root / "kernels" / BYREF).rev_parse("HEAD")


def _daemon(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    *,
    provenance: str = "warn",
    fetch: dict[str, Any] | None = None,
) -> tuple[DaemonProcess, str]:
    trusted_root = sigstore.write_trusted_root(daemon_dir("kd-gate-") / "trusted_root.json")
    config: dict[str, Any] = {
        "provenance": {
            "policy": provenance,
            "trusted_root": str(trusted_root),
            "identities": [{"identity": SIGNER.identity, "issuer": SIGNER.issuer}],
        },
        "trust": {"allow": []},
        "sockets": {"user_mode": "0666"},
    }
    if fetch:
        config["fetch"] = fetch
    return hub_api_daemon(make_daemon, hub_endpoint=hub.url, config=config)


# ---- the routes ---------------------------------------------------------------------------


def _selector(revision: str | None) -> str:
    """The keyword arguments of a `get_kernel` call: version 1, or this revision."""
    return "version=1" if revision is None else f"revision={revision!r}"


def job(d: DaemonProcess, tmp: Path, repo: str, revision: str | None = None) -> str:
    """kerneld_client.get_kernel (version 1, or `revision`): 'index' or 'daemon' (where it came
    from), or the error."""
    env = client_env(
        d.store_root, tmp, KERNELD_SOCKET=str(d.user_socket), KERNELD_PLATFORM_JSON=CPU_FACTS
    )
    code = f"""
import json, torch, kerneld_client
try:
    kerneld_client.get_kernel({repo!r}, {_selector(revision)}, policy="error")
except kerneld_client.KernelError as exc:
    print(json.dumps({{"out": type(exc).__name__ + ": " + exc.message}}))
else:
    print(json.dumps({{"out": kerneld_client.loaded_kernels()[-1].source}}))
"""
    out: str = run_client(code, env)["out"]
    return out


def hook(
    d: DaemonProcess, hub: HubServer, tmp: Path, repo: str, revision: str | None = None
) -> str:
    """`kernels.get_kernel` (version 1, or `revision`) with the hook on: 'kerneld:<source>',
    'kernels' (its own download: kerneld did not decide) or the error."""
    env = client_env(
        None,
        tmp,
        KERNELD_SOCKET=str(d.user_socket),
        KERNELD_HOOK_KERNELS="1",
        KERNELD_PLATFORM_JSON=CPU_FACTS,
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp / "hf-home"),
    )
    code = f"""
import json, torch, kernels, kerneld_client
try:
    module = kernels.get_kernel({repo!r}, {_selector(revision)})
except Exception as exc:
    print(json.dumps({{"out": type(exc).__name__ + ": " + str(exc)}}))
else:
    source = next((k.source for k in kerneld_client.loaded_kernels() if k.module is module), None)
    print(json.dumps({{"out": f"kerneld:{{source}}" if source else "kernels"}}))
"""
    out: str = run_client(code, env)["out"]
    return out


def endpoint(url: str, path: str, uid: int | None = None) -> tuple[int, str]:
    """(status, error message) of one GET on the Hub API endpoint, as `uid` (None: root)."""

    def get() -> tuple[int, str]:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.getheader("X-Error-Message") or ""
        finally:
            conn.close()

    if uid is None:
        return get()
    status, message = as_user(uid, NOBODY.pw_gid, lambda: list(get()))
    return int(status), str(message)


def ask(url: str, method: str, path: str, body: bytes = b"") -> tuple[int, str]:
    """(status, error message) of one request of any method on the endpoint, as root."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("X-Error-Message") or ""
    finally:
        conn.close()


def about_the_tree(url: str, repo: str) -> dict[str, tuple[int, str]]:
    """Every endpoint answer about `repo`'s v1 tree other than the file's bytes: HEAD of a
    file (size, ETag, commit), the tree listing, revision info with blobs, paths-info."""
    return {
        "head": ask(url, "HEAD", file_path(repo)),
        "tree": ask(url, "GET", f"/api/kernels/{repo}/tree/v1/build?recursive=1"),
        "revision": ask(url, "GET", f"/api/kernels/{repo}/revision/v1?blobs=1"),
        "paths-info": ask(
            url,
            "POST",
            f"/api/kernels/{repo}/paths-info/v1",
            f"paths=build/{VARIANT}/__init__.py".encode(),
        ),
    }


def env(d: DaemonProcess, tmp: Path, *kernels: str) -> tuple[int, str]:
    """`kerneldctl env` on the daemon's store (read directly): (exit status, its output)."""
    done = run_ctl("env", "--store", str(d.store_root), *kernels, home=tmp / "ctl-env")
    return done.rc, done.stdout + done.stderr


def refused_by_env(d: DaemonProcess, tmp: Path, repo: str, reason: str) -> None:
    """`kerneldctl env REPO:1` refuses with one line naming `reason`, never a traceback."""
    rc, out = env(d, tmp, f"{repo}:1")
    assert rc != 0 and reason in out and "Traceback" not in out, out
    assert d.store_root.as_posix() + "/" not in out.split("LOCAL_KERNELS=", 1)[-1], out
    assert len([line for line in out.splitlines() if reason in line]) == 1, out


def file_path(repo: str, name: str = "__init__.py", revision: str = "v1") -> str:
    return f"/kernels/{repo}/resolve/{revision}/build/{VARIANT}/{name}"


def prefetch(
    d: DaemonProcess, tmp: Path, repo: str, revision: str | None = None
) -> tuple[int, str]:
    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
    spec = f"{repo}:1" if revision is None else f"{repo}@{revision}"
    done = run_ctl("prefetch", spec, home=tmp / "ctl", env=env)
    return done.rc, done.stdout + done.stderr


def ctl(d: DaemonProcess, tmp: Path, *args: str) -> tuple[int, str]:
    """A kerneldctl command through the daemon's admin socket: (exit status, its output)."""
    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
    done = run_ctl(*args, home=tmp / "ctl", env=env)
    return done.rc, done.stdout + done.stderr


def audit_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.logs().splitlines() if "audit caller=" in line]


# ---- the policies -------------------------------------------------------------------------


@needs_root
def test_provenance_require_refuses_unsigned_on_every_route(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d, url = _daemon(make_daemon, hub, sigstore)
    # Both in the store (warn: served, recorded), then the site requires signatures.
    assert job(d, tmp_path, SIGNED) == "daemon" and job(d, tmp_path, UNSIGNED) == "daemon"
    d.write_config({**d.config, "provenance": {**d.config["provenance"], "policy": "require"}})
    assert (
        run_ctl(
            "reload", home=tmp_path / "ctl", env={"KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
        ).rc
        == 0
    )

    refused = "no sigstore signature"
    assert job(d, tmp_path, SIGNED) == "index"
    assert job(d, tmp_path, UNSIGNED).startswith("KernelDenied") and refused in job(
        d, tmp_path, UNSIGNED
    )
    assert hook(d, hub, tmp_path, SIGNED) == "kerneld:index"
    assert refused in hook(d, hub, tmp_path, UNSIGNED)
    # The endpoint: a tree already in the store is refused too (it served it before issue 41).
    assert endpoint(url, file_path(SIGNED))[0] == 200
    status, message = endpoint(url, file_path(UNSIGNED))
    assert status == 403 and refused in message, (status, message)
    assert prefetch(d, tmp_path, SIGNED)[0] == 0
    rc, out = prefetch(d, tmp_path, UNSIGNED)
    assert rc != 0 and refused in out, out
    # Issue 52, finding 7: every answer about the refused tree is refused, not only its bytes.
    signed = about_the_tree(url, SIGNED)
    assert all(status == 200 for status, _ in signed.values()), signed
    for route, (status, message) in about_the_tree(url, UNSIGNED).items():
        assert status == 403, (route, status, message)
        assert refused in message, (route, message)
    # Finding 8: kerneldctl env hands out only what the daemon would.
    rc, out = env(d, tmp_path, f"{SIGNED}:1")
    assert rc == 0 and f"{SIGNED}=" in out, out
    refused_by_env(d, tmp_path, UNSIGNED, "requires signed kernels")


@needs_root
def test_a_deny_holds_on_every_route(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d, url = _daemon(make_daemon, hub, sigstore)
    assert job(d, tmp_path, SIGNED) == "daemon"
    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
    assert run_ctl("deny", SIGNED, "--reason", "bad build", home=tmp_path / "c", env=env).rc == 0
    assert job(d, tmp_path, SIGNED).startswith("KernelDenied")
    assert "bad build" in hook(d, hub, tmp_path, SIGNED)
    status, message = endpoint(url, file_path(SIGNED))
    assert status == 403 and "bad build" in message, (status, message)
    assert endpoint(url, f"/api/kernels/{SIGNED}/revision/v1")[0] == 403
    rc, out = prefetch(d, tmp_path, SIGNED)
    assert rc != 0 and "bad build" in out, out
    refused_by_env(d, tmp_path, SIGNED, "bad build")  # issue 52, finding 8: no traceback


def _refused_everywhere(
    d: DaemonProcess,
    hub: HubServer,
    url: str,
    tmp: Path,
    repo: str,
    revision: str | None,
    reason: str,
) -> None:
    """`repo` (version 1, or `revision`) is refused with `reason` on the RPC path or the
    published index, the hook, the endpoint (file and revision) and kerneldctl prefetch."""
    what = (repo, revision)
    out = job(d, tmp, repo, revision)
    assert out.startswith("KernelDenied") and reason in out, (what, out)
    out = hook(d, hub, tmp, repo, revision)
    assert reason in out, (what, out)
    status, message = endpoint(url, file_path(repo, revision=revision or "v1"))
    assert status == 403 and reason in message, (what, status, message)
    status, message = endpoint(url, f"/api/kernels/{repo}/revision/{revision or 'v1'}")
    assert status == 403 and reason in message, (what, status, message)
    rc, out = prefetch(d, tmp, repo, revision)
    assert rc != 0 and reason in out, (what, out)


@needs_root
def test_a_deny_holds_for_every_spelling_of_the_repo_id(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    """Issue 52, finding 3: the Hub answers `goodcorp/DenyMe` and `GoodCorp/denyme` with
    `goodcorp/denyme`'s commit, so a deny of one spelling must refuse every spelling on every
    route: a spelling already in the store (the warm path, the mirror import) and one that is
    not (the daemon's check before any upstream request)."""
    d, url = _daemon(make_daemon, hub, sigstore)
    stored = CASE_VARIANTS[0]
    assert job(d, tmp_path, stored) == "daemon"  # fetched under a case variant before the deny
    bundle = tmp_path / "denyme.tar"
    assert ctl(d, tmp_path, "mirror", "export", "--to", str(bundle), stored)[0] == 0
    rc, out = ctl(d, tmp_path, "deny", DENYME, "--reason", "advisory 52")
    assert rc == 0 and f"denied {DENYME}" in out, out
    hub.reset_counts()
    for repo in CASE_VARIANTS:
        _refused_everywhere(d, hub, url, tmp_path, repo, None, "advisory 52")
    rc, out = ctl(d, tmp_path, "mirror", "import", "--from", str(bundle), "--no-check-sigs")
    assert rc != 0 and "denied on this host" in out and "advisory 52" in out, out
    # Nothing of the denied repo was asked of the Hub under any spelling.
    asked = [r.path for r in hub.requests if "denyme" in r.path.lower()]
    assert asked == [], asked
    rc, out = ctl(d, tmp_path, "ls", "--json")
    kernels = {k["repo_id"]: k for k in json.loads(out)["kernels"]}
    assert kernels[stored]["denied"] is True, kernels
    # The allow lifts it for every spelling too.
    assert ctl(d, tmp_path, "allow", "GoodCorp/DenyMe")[0] == 0
    assert job(d, tmp_path, stored) == "index"


@needs_root
def test_a_deny_by_ref_or_commit_prefix_refuses_the_commit_however_it_is_named(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    byref_commit: str,
    tmp_path: Path,
) -> None:
    """Issue 52, finding 4: `deny org/x@v1` and `deny org/x@<8 hex>` left the commit loadable
    through `main`, its sha or a tag. Both are resolved to the full commit when denied (and the
    command says so); a too short or unknown revision is refused; a deny of the ref name
    itself is explicit (`--ref`) and refuses requests that name it."""
    commit = byref_commit
    d, url = _daemon(make_daemon, hub, sigstore)
    assert job(d, tmp_path, BYREF, "main") == "daemon"
    names = ("main", "v1", TAG, commit)
    for how in ("v1", commit[:8]):
        rc, said = ctl(d, tmp_path, "deny", f"{BYREF}@{how}", "--reason", f"bad build {how}")
        assert rc == 0, said
        for name in names:
            _refused_everywhere(d, hub, url, tmp_path, BYREF, name, f"bad build {how}")
        assert f"denied {BYREF}@{commit} ({how} -> {commit})" in said, said
        rc, out = ctl(d, tmp_path, "ls", "--json")
        (kernel,) = [k for k in json.loads(out)["kernels"] if k["repo_id"] == BYREF]
        (rev,) = kernel["revisions"]
        assert rev["denied"] is True and rev["denied_by"] == ["commit"], rev
        rc, out = ctl(d, tmp_path, "allow", f"{BYREF}@{how}")
        assert rc == 0 and f"allowed {BYREF}@{commit}" in out, out
        assert job(d, tmp_path, BYREF, "main") == "index"
    # Too short, unknown upstream and here, or a commit where a ref name is wanted: refused.
    for args, words in (
        ((f"{BYREF}@{commit[:6]}",), "at least 7 hex digits"),
        ((f"{BYREF}@{'0' * 8}",), f"no commit of {BYREF}"),
        ((f"{BYREF}@no-such-branch",), "--ref"),
        (("--ref", f"{BYREF}@{commit[:8]}"), "reads as a commit"),
    ):
        rc, out = ctl(d, tmp_path, "deny", *args)
        assert rc == 1 and words in out, (args, out)
    rc, out = ctl(d, tmp_path, "deny", "--list", "--json")
    assert json.loads(out)["denies"] == [], out
    # The ref name itself, explicitly: requests naming it are refused, the commit is not.
    rc, out = ctl(d, tmp_path, "deny", "--ref", f"{BYREF}@v1", "--reason", "channel closed")
    assert rc == 0 and "the ref name" in out, out
    _refused_everywhere(d, hub, url, tmp_path, BYREF, "v1", "channel closed")
    assert job(d, tmp_path, BYREF, "main") == "index"
    rc, out = ctl(d, tmp_path, "deny", "--list")
    assert f"{BYREF}@v1  the ref v1: requests that name it" in out and commit in out, out
    rc, out = ctl(d, tmp_path, "ls")
    assert "ref v1 DENIED" in out and "DENIED by" not in out, out


@needs_root
def test_an_untrusted_publisher_is_refused_on_every_route(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d, url = _daemon(make_daemon, hub, sigstore)
    untrusted = "not a trusted kernel publisher"
    assert job(d, tmp_path, UNTRUSTED).startswith("UntrustedPublisher")
    assert untrusted in hook(d, hub, tmp_path, UNTRUSTED)
    status, message = endpoint(url, file_path(UNTRUSTED))
    assert status == 403 and untrusted in message, (status, message)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    conn.request("GET", f"/api/organizations/{OTHER}/overview")
    assert json.loads(conn.getresponse().read())["trustedKernelPublisher"] is False
    conn.close()
    rc, out = prefetch(d, tmp_path, UNTRUSTED)
    assert rc != 0 and untrusted in out, out
    # Nothing of the untrusted kernel was downloaded by any route.
    downloads = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert not any(UNTRUSTED in p for p in downloads), downloads


@needs_root
def test_kerneldctl_env_refuses_a_publisher_no_longer_trusted(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    """Issue 52, finding 8: a kernel fetched while its publisher was allowed, then the allow
    removed: `kerneldctl env` refuses it with one line, as the daemon does."""
    d, _ = _daemon(make_daemon, hub, sigstore)
    d.write_config({**d.config, "trust": {"allow": [f"{OTHER}/*"]}})
    assert ctl(d, tmp_path, "reload")[0] == 0
    assert job(d, tmp_path, UNTRUSTED) == "daemon"
    rc, out = env(d, tmp_path, f"{UNTRUSTED}:1")
    assert rc == 0 and f"{UNTRUSTED}=" in out, out
    d.write_config({**d.config, "trust": {"allow": []}})
    assert ctl(d, tmp_path, "reload")[0] == 0
    assert job(d, tmp_path, UNTRUSTED).startswith("UntrustedPublisher")
    refused_by_env(d, tmp_path, UNTRUSTED, "not a trusted kernel publisher")


@needs_root
def test_allow_groups_the_budget_and_the_audit_line_hold_on_the_rpc_path_and_the_endpoint(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    # Outsiders may not make the daemon download: the RPC path and the endpoint refuse alike,
    # each with an audit line naming the real uid.
    d, url = _daemon(make_daemon, hub, sigstore, fetch={"allow_groups": ["kerneld-admin"]})
    status, message = endpoint(url, file_path(SIGNED), uid=NOBODY.pw_uid)
    assert status == 403 and "allow_groups" in message, (status, message)
    refused = [x for x in audit_lines(d) if f"uid={NOBODY.pw_uid}(nobody)" in x]
    assert refused and all("fetch refused" in x for x in refused), refused
    assert any("rpc=hub-api" in x for x in refused), refused
    assert endpoint(url, file_path(SIGNED))[0] == 200  # root: allowed, audited
    assert any("uid=0(root)" in x and "fetch allowed" in x for x in audit_lines(d))
    assert endpoint(url, file_path(SIGNED), uid=NOBODY.pw_uid)[0] == 200  # now cached
    d.stop()

    # A budget of one download per uid: the endpoint spends it as a Resolve does.
    d, url = _daemon(make_daemon, hub, sigstore, fetch={"per_uid_rate": 0.1, "per_uid_burst": 1})
    assert endpoint(url, file_path(SIGNED), uid=NOBODY.pw_uid)[0] == 200
    status, message = endpoint(url, file_path(UNSIGNED), uid=NOBODY.pw_uid)
    assert status == 429 and "per_uid_rate" in message, (status, message)
    lines = [x for x in audit_lines(d) if f"uid={NOBODY.pw_uid}(nobody)" in x]
    assert any("fetch allowed" in x for x in lines) and any("RateLimited" in x for x in lines)
    # Organisation overviews the daemon must ask the Hub about are charged too.
    status, _ = endpoint(url, "/api/organizations/made-up-org/overview", uid=NOBODY.pw_uid)
    assert status == 429, status


@needs_root
def test_field_bounds_and_made_up_names_cost_nothing_and_leave_nothing(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d, url = _daemon(make_daemon, hub, sigstore)
    assert job(d, tmp_path, SIGNED) == "daemon"
    publishers = d.store_root / "index" / "v1" / "publishers.json"
    before = publishers.read_bytes()
    hub.reset_counts()
    # A revision over the wire's bound: refused before anything is asked or written (one that
    # does not even fit the HTTP front's head limit is refused before it is parsed).
    status, message = endpoint(url, f"/api/kernels/{SIGNED}/revision/{'r' * 1000}")
    assert status == 400 and "revision" in message and "limit" in message, (status, message)
    status, _ = endpoint(url, f"/api/kernels/{SIGNED}/revision/{'r' * 60_000}")
    assert status == 431, status
    assert hub.total() == 0, hub.requests
    # Made-up organisations: the Hub is asked once each (charged to the caller), the answer
    # is a 404 ("could not verify", as on the Hub), and nothing is published.
    for i in range(20):
        org = f"made-up-{i}"
        status, message = endpoint(url, f"/api/organizations/{org}/overview")
        assert status == 404 and "could not verify" in message, (status, message)
    assert hub.counts["org_overview"] == 20, dict(hub.counts)
    assert publishers.read_bytes() == before
    # A Resolve of a made-up repo that may not fetch asks nobody and records nothing.
    with d.kernels() as kernels:
        hub.reset_counts()
        _, detail = failure(kernels.Resolve, resolve_req("made-up-org/x", 1, allow_fetch=False))
        assert detail.code == pb.FETCH_NOT_ALLOWED, detail
        assert hub.total() == 0, hub.requests
    assert publishers.read_bytes() == before


def test_after_a_prefetch_the_first_job_loads_from_the_index(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d, _ = _daemon(make_daemon, hub, sigstore)
    assert prefetch(d, tmp_path, SIGNED)[0] == 0
    assert job(d, tmp_path, SIGNED) == "index"  # no RPC: the publisher's verdict is published


def test_an_outage_after_a_restart_costs_the_upstream_no_more_per_job(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    """Unmodified `kernels` (huggingface_hub) through the endpoint, the upstream answering 503
    and the daemon restarted on its store: the first job pays for asking, the next ones
    nothing (failed listings are remembered), and every job gets the kernel."""
    d, url = _daemon(make_daemon, hub, sigstore)
    assert job(d, tmp_path, SIGNED) == "daemon"
    hub.inject(Fault("*", "error", status=503))
    try:
        d.restart()
        url = endpoint_of(d)
        costs = []
        for i in range(3):
            hub.reset_counts()
            started = time.monotonic()
            out = _snapshot(url, tmp_path / f"job-{i}")
            costs.append((hub.total(), round(time.monotonic() - started, 2)))
            assert out == "ok", out
        _, *later = costs
        assert all(requests <= 2 for requests, _ in later), costs
    finally:
        hub.clear_faults()


def _snapshot(url: str, cache: Path) -> str:
    code = f"""
from huggingface_hub import snapshot_download
snapshot_download({SIGNED!r}, repo_type="kernel", revision="v1", cache_dir={str(cache)!r},
                  allow_patterns=["build/{VARIANT}/*"])
print("ok")
"""
    env = {"HF_ENDPOINT": url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_USER_AGENT_ORIGIN": "t"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**client_env(None, cache.parent), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else done.stderr[-800:]
