"""Publisher trust, as `kernels` applies it: a kernel whose organisation the Hub does not list as
a trusted kernel publisher is refused unless the job passes `trust_remote_code`; `[trust]`
allow-lists publishers for sites whose daemon cannot ask the Hub, and `publishers = "any"`
keeps the behaviour from before the check.

Real daemon (as its unprivileged user), real gRPC, the Hub-compatible test server answering
`/api/organizations/{org}/overview`, and job processes that load through the published index.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, failure, http_get_unix, metric, resolve_req
from tests.fixtures_daemon import ACT, DEP_BOTTOM
from tests.fixtures_hub import REPO, UNTRUSTED_ORG, UNTRUSTED_REPO
from tests.security.support import CPU_FACTS
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

HUB_POLICY = {"trust": {"allow": []}}  # the default policy: the Hub's trusted publishers only


def _publishers(d: DaemonProcess) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        (d.store_root / "index" / "v1" / "publishers.json").read_text()
    )
    return doc


def _job(d: DaemonProcess, tmp: Path, repo: str, trust: str = "False") -> dict[str, Any]:
    """A job process: get_kernel(repo) with the error policy; its source or its typed error."""
    env = client_env(
        d.store_root, tmp, KERNELD_SOCKET=str(d.user_socket), KERNELD_PLATFORM_JSON=CPU_FACTS
    )
    code = f"""
import json, torch, kerneld_client
try:
    kerneld_client.get_kernel({repo!r}, version=1, policy="error", trust_remote_code={trust})
except kerneld_client.KernelError as exc:
    print(json.dumps({{"error": type(exc).__name__, "message": exc.message, "hint": exc.hint}}))
else:
    print(json.dumps({{"source": kerneld_client.loaded_kernels()[-1].source}}))
"""
    return {k: v for k, v in run_client(code, env).items() if not k.startswith("_")}


def test_the_hubs_trusted_publishers_are_served_and_others_refused(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, tmp_path: Path
) -> None:
    metrics = daemon_dir("kd-t-") / "metrics.sock"
    d = make_daemon(
        hub_endpoint=hub_server.url, config={**HUB_POLICY, "metrics": {"socket": str(metrics)}}
    )
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel.path
        status, detail = failure(kernels.Resolve, resolve_req(UNTRUSTED_REPO, 1))
        assert status == grpc.StatusCode.PERMISSION_DENIED
        assert detail.code == pb.UNTRUSTED_PUBLISHER
        assert f"{UNTRUSTED_ORG} is not a trusted kernel publisher" in detail.message
        assert "trust_remote_code" in detail.hint and "[trust] allow" in detail.hint
        # The Hub's answers are remembered: one overview request per organisation.
        failure(kernels.Resolve, resolve_req(UNTRUSTED_REPO, 1))
        assert hub_server.counts["org_overview"] == 2, hub_server.requests
        # A job that trusts the code itself gets it, as with `kernels`.
        trusted = kernels.Resolve(
            resolve_req(UNTRUSTED_REPO, 1, trust_remote_code=True), timeout=TIMEOUT
        )
        assert trusted.kernel.path
    # Only a "yes" is published (the warm path needs no other); a "no" stays in the daemon.
    assert _publishers(d)["orgs"].keys() == {"kerneld-trusted"}
    assert metric(http_get_unix(metrics), "kerneld_resolves_total", result="untrusted") == 2

    # Jobs: the trusted kernel loads warm from the index; the untrusted one, although its tree
    # is in the store now, is refused with the typed error, and loads for a job that trusts it.
    assert _job(d, tmp_path, REPO) == {"source": "index"}
    refused = _job(d, tmp_path, UNTRUSTED_REPO)
    assert refused["error"] == "UntrustedPublisher", refused
    assert "not a trusted kernel publisher" in refused["message"]
    assert "trust_remote_code" in refused["hint"]
    assert _job(d, tmp_path, UNTRUSTED_REPO, trust="True") == {"source": "index"}
    assert _job(d, tmp_path, UNTRUSTED_REPO, trust=f"[{UNTRUSTED_REPO!r}]") == {"source": "index"}
    assert _job(d, tmp_path, UNTRUSTED_REPO, trust="['other/repo']")["error"] == (
        "UntrustedPublisher"
    )


def test_a_publisher_that_loses_the_hubs_trust_is_refused_after_the_ttl(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, tmp_path: Path
) -> None:
    d = make_daemon(hub_endpoint=hub_server.url, config={"trust": {"allow": [], "ttl": "1s"}})
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel.path
    assert _job(d, tmp_path, REPO) == {"source": "index"}
    hub_server.set_trusted("kerneld-trusted", False)
    # Jobs load warm without asking the daemon: the daemon re-asks the Hub by itself once the
    # answer is past its TTL, and withdraws the published verdict.
    deadline = time.monotonic() + 15
    while "kerneld-trusted" in _publishers(d)["orgs"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "kerneld-trusted" not in _publishers(d)["orgs"]
    assert _job(d, tmp_path, REPO)["error"] == "UntrustedPublisher"
    with d.kernels() as kernels:
        _, detail = failure(kernels.Resolve, resolve_req(REPO, 1))
        assert detail.code == pb.UNTRUSTED_PUBLISHER, detail


def test_a_hub_outage_keeps_known_publishers_across_a_restart(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer
) -> None:
    d = make_daemon(hub_endpoint=hub_server.url, config={"trust": {"allow": [], "ttl": "1s"}})
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel.path
        # In the store, for a job that trusted its code: the daemon never asked about its org.
        asked = resolve_req(UNTRUSTED_REPO, 1, trust_remote_code=True)
        assert kernels.Resolve(asked, timeout=TIMEOUT).kernel.path
    d.restart()
    hub_server.inject(Fault("*", "error", status=503))
    time.sleep(1.2)  # the remembered answer is past its TTL and cannot be renewed
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel.path
        # A kernel that exists (in the store), its publisher never asked about, and the Hub
        # down: an outage, not a verdict; says why.
        status, detail = failure(kernels.Resolve, resolve_req(UNTRUSTED_REPO, 1))
        assert status == grpc.StatusCode.UNAVAILABLE
        assert detail.code == pb.UPSTREAM_UNAVAILABLE
        assert "could not verify" in detail.message and "503" in detail.message, detail
        assert "[trust] allow" in detail.hint


def test_an_air_gapped_site_trusts_its_allow_list(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    # A mirror-only daemon cannot ask the Hub: [trust] allow is the only voucher.
    d = make_daemon(mirror_dirs=[kernel_mirror], config={"trust": {"allow": [ACT]}})
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.path
        status, detail = failure(kernels.Resolve, resolve_req(DEP_BOTTOM, 1))
        assert status == grpc.StatusCode.PERMISSION_DENIED
        assert detail.code == pb.UNTRUSTED_PUBLISHER
        assert "no Hub upstream to ask" in detail.message, detail
    assert _job(d, tmp_path, ACT) == {"source": "index"}

    # "allow-list" says so outright; with honor_trust_remote_code = false a job cannot override.
    d.stop()
    d.write_config(
        {"trust": {"publishers": "allow-list", "allow": [ACT], "honor_trust_remote_code": False}}
    )
    d.start()
    with d.kernels() as kernels:
        req = resolve_req(DEP_BOTTOM, 1, trust_remote_code=True)
        _, detail = failure(kernels.Resolve, req)
        assert detail.code == pb.UNTRUSTED_PUBLISHER
        assert "not in [trust] allow" in detail.message
        assert "trust_remote_code" not in detail.hint and "[trust] allow" in detail.hint
    assert _job(d, tmp_path, DEP_BOTTOM, trust="True")["error"] == "UntrustedPublisher"


def test_publishers_any_keeps_the_behaviour_before_the_check(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, tmp_path: Path
) -> None:
    d = make_daemon(hub_endpoint=hub_server.url, config={"trust": {"publishers": "any"}})
    with d.kernels() as kernels:
        assert kernels.Resolve(resolve_req(UNTRUSTED_REPO, 1), timeout=TIMEOUT).kernel.path
    assert hub_server.counts["org_overview"] == 0
    assert _job(d, tmp_path, UNTRUSTED_REPO) == {"source": "index"}
