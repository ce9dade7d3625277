"""Signed kernels, end to end: the daemon checks a variant's sigstore bundle once, at ingest, and
every job gets the answer with the kernel.

Real daemon (as its unprivileged user) with the Hub test server as its upstream, serving three
repos of one `scale` kernel: signed by a trusted identity, unsigned, and signed through another
Sigstore instance. The bundles come from a test-local Sigstore (tests/support/sigstore_local.py)
whose trusted root the daemon is given (`[provenance] trusted_root`); sigstore's own verifier
checks them. Jobs load through the RPC path, then through the published index (warm).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.support import client_env, run_client
from tests.security.support import CPU_FACTS
from tests.support.ctl import run_ctl
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.gitrepo import GitRepo, kernel_variant_files
from tests.support.hubserver import HubServer
from tests.support.sigstore_local import LocalSigstore, Signer

ORG = "signed-kernels"
SIGNED, UNSIGNED, FORGED = (f"{ORG}/{name}" for name in ("signed", "unsigned", "forged"))
VARIANT = "torch-universal"
SIGNER = Signer()


@pytest.fixture(scope="module")
def sigstore() -> LocalSigstore:
    return LocalSigstore()


@pytest.fixture(scope="module")
def hub(sigstore: LocalSigstore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("signed-hub")
    for repo, signing in ((SIGNED, sigstore), (UNSIGNED, None), (FORGED, LocalSigstore())):
        name = repo.split("/")[1]
        files = kernel_variant_files(name=name, version=1, factor=2.0, variant=VARIANT)
        if signing is not None:
            meta = files[f"build/{VARIANT}/metadata.json"]
            files[f"build/{VARIANT}/metadata.json.sigstore"] = signing.sign(meta, SIGNER)
        git = GitRepo(root / "kernels" / repo)
        git.commit("v1", files)
        git.branch("v1")
    with HubServer(root, trusted_orgs={ORG: True}) as server:
        yield server


def _daemon(
    make_daemon: Callable[..., DaemonProcess], hub: HubServer, sigstore: LocalSigstore, policy: str
) -> DaemonProcess:
    trusted_root = sigstore.write_trusted_root(daemon_dir("kd-prov-") / "trusted_root.json")
    provenance = {
        "policy": policy,
        "trusted_root": str(trusted_root),
        "identities": [{"identity": SIGNER.identity, "issuer": SIGNER.issuer}],
    }
    return make_daemon(f"d-{policy}", hub_endpoint=hub.url, config={"provenance": provenance})


def _job(d: DaemonProcess, tmp: Path, repo: str) -> dict[str, Any]:
    """A job: get_kernel(repo) with the error policy; where it came from and who signed it."""
    env = client_env(
        d.store_root, tmp, KERNELD_SOCKET=str(d.user_socket), KERNELD_PLATFORM_JSON=CPU_FACTS
    )
    code = f"""
import json, torch, kerneld_client
try:
    kerneld_client.get_kernel({repo!r}, version=1, policy="error")
except kerneld_client.KernelError as exc:
    print(json.dumps({{"error": type(exc).__name__, "message": exc.message}}))
else:
    k = kerneld_client.loaded_kernels()[-1]
    p = k.provenance
    print(json.dumps({{"source": k.source, "provenance": p and [p.status, p.signer, p.issuer]}}))
"""
    return {k: v for k, v in run_client(code, env).items() if not k.startswith("_")}


def _kernelize(d: DaemonProcess, tmp: Path, repo: str) -> dict[str, Any]:
    """A job that kernelizes a `Scale` layer from `repo`: its report entry."""
    env = client_env(
        d.store_root, tmp, KERNELD_SOCKET=str(d.user_socket), KERNELD_PLATFORM_JSON=CPU_FACTS
    )
    code = f"""
import json, torch
from kerneld_client import (LayerRepository, Mode, kernelize, kernelize_report,
                            use_kernel_forward_from_hub, use_kernel_mapping)

@use_kernel_forward_from_hub("Scale")
class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

model = torch.nn.Sequential(Scale())
repo = LayerRepository({repo!r}, layer_name="Scale", version=1)
with use_kernel_mapping({{"Scale": {{"cpu": repo}}}}):
    kernelize(model, mode=Mode.INFERENCE, device="cpu")
entry = kernelize_report(model).layers[0]
print(json.dumps({{"status": entry.status.value, "provenance": entry.provenance,
                  "text": kernelize_report(model).format()}}))
"""
    return {k: v for k, v in run_client(code, env).items() if not k.startswith("_")}


def _info(d: DaemonProcess, tmp: Path, repo: str) -> tuple[str, dict[str, Any]]:
    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket), "KERNELD_SOCKET": str(d.user_socket)}
    human = run_ctl("info", repo, home=tmp / "ctl", env=env)
    assert human.rc == 0, human.stderr
    doc = run_ctl("info", repo, "--json", home=tmp / "ctl", env=env).json()
    return human.stdout, doc["revisions"][0]["variants"][0]["provenance"]


def test_require_serves_signed_kernels_and_refuses_the_rest(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d = _daemon(make_daemon, hub, sigstore, "require")
    verified = ["verified", SIGNER.identity, SIGNER.issuer]
    assert _job(d, tmp_path, SIGNED) == {"source": "daemon", "provenance": verified}
    assert _job(d, tmp_path, SIGNED) == {"source": "index", "provenance": verified}  # warm

    unsigned = _job(d, tmp_path, UNSIGNED)
    assert unsigned["error"] == "KernelDenied", unsigned
    assert "no sigstore signature" in unsigned["message"]
    assert '[provenance] policy = "require"' in unsigned["message"]
    forged = _job(d, tmp_path, FORGED)
    assert forged["error"] == "KernelDenied", forged
    assert "does not verify" in forged["message"] and SIGNER.identity in forged["message"]

    report = _kernelize(d, tmp_path, SIGNED)
    signed_by = f"verified: signed by {SIGNER.identity} (issuer {SIGNER.issuer})"
    assert (report["status"], report["provenance"]) == ("kernelized", signed_by), report
    assert "{" + signed_by + "}" in report["text"]

    human, record = _info(d, tmp_path, SIGNED)
    assert f"signature: verified: {SIGNER.identity} (issuer {SIGNER.issuer})" in human
    assert record["status"] == "verified" and record["signer"] == SIGNER.identity
    # nothing unverified entered the store
    listed = json.loads(
        run_ctl(
            "ls",
            "--json",
            home=tmp_path / "ctl",
            env={"KERNELD_ADMIN_SOCKET": str(d.admin_socket)},
        ).stdout
    )
    with_variants = [
        k["repo_id"] for k in listed["kernels"] if any(r["variants"] for r in k["revisions"])
    ]
    assert with_variants == [SIGNED]
    # The daemon's listing and the offline one (`--store`, the store read directly) are one.
    d.stop()
    offline = run_ctl("ls", "--json", "--store", str(d.store_root), home=tmp_path / "ctl")
    assert offline.rc == 0, offline.stderr
    assert offline.json() == listed


def test_warn_records_and_serves_then_require_withdraws(
    make_daemon: Callable[..., DaemonProcess],
    hub: HubServer,
    sigstore: LocalSigstore,
    tmp_path: Path,
) -> None:
    d = _daemon(make_daemon, hub, sigstore, "warn")
    assert _job(d, tmp_path, UNSIGNED) == {"source": "daemon", "provenance": ["unsigned", "", ""]}
    forged = _job(d, tmp_path, FORGED)
    assert forged["source"] == "daemon" and forged["provenance"][0] == "invalid"
    human, record = _info(d, tmp_path, FORGED)
    assert "signature: invalid: signature by builder@kernels.example" in human
    assert record["status"] == "invalid" and "does not verify" in record["detail"]
    # The same flags whether the daemon lists the store or kerneldctl reads it (--store).
    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
    via_daemon = run_ctl("ls", home=tmp_path / "ctl", env=env).stdout
    offline = run_ctl("ls", "--store", str(d.store_root), home=tmp_path / "ctl").stdout
    for flag in ("unsigned", "INVALID"):
        assert flag in via_daemon and flag in offline, (via_daemon, offline)

    # The site tightens its policy (SIGHUP): the trees already in the store are withdrawn from
    # the published index and refused on the RPC path, with the reason recorded at ingest.
    d.write_config({"provenance": {**d.config["provenance"], "policy": "require"}})
    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket)}
    reloaded = run_ctl("reload", home=tmp_path / "ctl", env=env)
    assert reloaded.rc == 0 and "[provenance] policy" in reloaded.stdout, reloaded
    refused = _job(d, tmp_path, UNSIGNED)
    assert refused["error"] == "KernelDenied" and "no sigstore signature" in refused["message"]
    index = json.loads((d.store_root / "index" / "v1" / ORG / "unsigned.json").read_text())
    assert all(not c["variants"] for c in index["commits"].values())
