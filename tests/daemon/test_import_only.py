"""An import-only host (`upstream = []`): kernels arrive only by `kerneldctl mirror import`.

Two real daemons (as their unprivileged user, real sockets, real SQLite): the export host
fetches from the suite's kernel mirror and exports a signed bundle through `kerneldctl`; the
import host has no upstream and imports it. What it must do (issue 51):

- start, and say "import-only" in `kerneldctl status`, with no upstream listed;
- serve the imported kernels cold (Resolve) and warm (a job through the published index) with
  no `[trust] allow` edit: the bundle's signed publisher verdicts vouch for them;
- never open a network connection: `HF_ENDPOINT` points at a loopback test Hub that must see 0
  requests, and the daemon holds no TCP or UDP socket;
- past `ref_ttl`: no re-check, no warning in its log, no failed-recheck metric, nothing stale;
- a verdict edited after signing is refused with the bundle; the importing site's deny and
  `[trust] publishers = "allow-list"` win over the exporting site's verdicts; a bundle without
  verdicts (an older kerneld's) imports, and its kernels need `[trust] allow` (the refusal
  names the line to add).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from kerneld.ctl.cmd_status import IMPORT_ONLY_LINE
from kerneld.mirror.keys import SigningKey, generate_key, signature_file
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT, failure, http_get_unix, metric, resolve_req
from tests.daemon.test_trust import _job
from tests.fixtures_daemon import ACT, C1
from tests.support.ctl import KERNELDCTL, Result, ctl_env, run_ctl
from tests.support.daemon import DaemonProcess, daemon_dir, grant_traversal
from tests.support.hubserver import HubServer

MANIFEST = f"manifests/{ACT}/{C1}.json"


@dataclass
class Sites:
    exporter: DaemonProcess
    key: SigningKey
    keys: Path
    home: Path
    hub: HubServer
    make: Callable[..., DaemonProcess]

    def ctl(self, d: DaemonProcess, *args: str) -> Result:
        env = {
            "KERNELD_ADMIN_SOCKET": str(d.admin_socket),
            "KERNELD_SOCKET": str(d.user_socket),
            "KERNELD_KEY_DIR": str(self.keys),
        }
        return run_ctl(*args, home=self.home, env=env)

    def export(self, to: Path) -> Path:
        to.parent.mkdir(parents=True, exist_ok=True)
        assert self.ctl(self.exporter, "prefetch", f"{ACT}:1", "--variants", "all").rc == 0
        done = self.ctl(
            self.exporter, "mirror", "export", "--to", str(to), f"{ACT}:1", "--sign-key", "site-1"
        )
        assert done.rc == 0, done.stdout + done.stderr
        return to

    def import_host(self, name: str, **config: Any) -> DaemonProcess:
        """A daemon with no upstream, trusting no publisher by name, the exporter's key only;
        HF_ENDPOINT is the test Hub: a daemon that fell back to "the Hub" would be seen."""
        metrics = daemon_dir("kd-io-") / "metrics.sock"
        base = {
            "upstream": [],
            "trust": {"allow": []},
            "resolve": {"ref_ttl": "1s"},
            "mirror": {"trusted_keys": {"site-1": self.key.public}},
            "metrics": {"socket": str(metrics)},
        }
        return self.make(name, config={**base, **config}, env={"HF_ENDPOINT": self.hub.url})


@pytest.fixture
def sites(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> Iterator[Sites]:
    keys = tmp_path / "keys"
    key = generate_key("site-1", keys)
    # The export host trusts the suite's publishers (tests/support/daemon.py's [trust] allow).
    no_gpu = tmp_path / "no-gpu-host"  # /proc and /sys of a host without a GPU
    no_gpu.mkdir()
    exporter = make_daemon("exporter", mirror_dirs=[kernel_mirror], hardware_root=no_gpu)
    with HubServer(tmp_path / "hub-root") as hub:
        yield Sites(exporter, key, keys, tmp_path / "home", hub, make_daemon)


def _metrics(d: DaemonProcess) -> str:
    return http_get_unix(Path(d.config["metrics"]["socket"]))


def _inet_sockets(pid: int) -> list[str]:
    """The TCP/UDP sockets (v4 and v6) process `pid` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    held = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                held.append(f"{table} {fields[1]} -> {fields[2]}")
    return held


def test_an_import_only_host_serves_a_signed_import_with_no_trust_edit_and_no_network(
    sites: Sites, tmp_path: Path
) -> None:
    bundle = sites.export(tmp_path / "usb" / "kernels.tar")
    # What `auto` means on a host without a GPU, said once.
    assert sites.ctl(sites.exporter, "prefetch", f"{ACT}:1").rc == 0
    assert sites.exporter.logs().count("no GPU detected; prefetching CPU variants") == 1
    host = sites.import_host("airgap")

    status = sites.ctl(host, "status", "--json")
    assert status.rc == 0, status.stderr
    assert status.json()["import_only"] is True and not status.json().get("upstreams")
    assert IMPORT_ONLY_LINE in sites.ctl(host, "status").stdout

    imported = sites.ctl(host, "mirror", "import", "--from", str(bundle), "--json")
    assert imported.rc == 0, imported.stdout + imported.stderr
    report = imported.json()
    assert report["publishers_vouched"] == {ACT: "allow"} and report["without_verdicts"] == []
    published = json.loads((host.store_root / "index" / "v1" / "publishers.json").read_text())
    assert set(published["repos"]) == {ACT}

    # A mistyped path is one line; `--from -` reads the bundle from stdin (a second import of
    # the same bundle changes nothing).
    typo = sites.ctl(host, "mirror", "import", "--from", str(bundle) + "x")
    assert typo.rc == 1 and len(typo.stderr.strip().splitlines()) == 1, typo
    assert "does not exist" in typo.stderr and "Traceback" not in typo.stderr, typo
    env = ctl_env(sites.home, {"KERNELD_ADMIN_SOCKET": str(host.admin_socket)})
    piped = subprocess.run(
        [KERNELDCTL, "mirror", "import", "--from", "-", "--json"],
        stdin=bundle.open("rb"),
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["publishers_vouched"] == {ACT: "allow"}

    with host.kernels() as kernels:  # cold: the daemon answers, with no [trust] allow edit
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.path
    assert _job(host, tmp_path, ACT) == {"source": "index"}  # warm: the published index

    time.sleep(3)  # past ref_ttl (1s): an upstream host would re-check (and here, fail)
    with host.kernels() as kernels:
        answer = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
        assert answer.kernel.path and not answer.kernel.stale
    assert _job(host, tmp_path, ACT) == {"source": "index"}
    text = _metrics(host)
    assert metric(text, "kerneld_ref_rechecks_total", outcome="failed") == 0
    assert metric(text, "kerneld_stale_serves_total") == 0

    # Restarted, it still serves them: the verdicts were recorded in the store.
    host.restart()
    with host.kernels() as kernels:
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.path

    assert sites.hub.total() == 0, sites.hub.requests  # nothing asked "the Hub" either
    assert _inet_sockets(host.pid) == []
    warnings = [x for x in host.logs().splitlines() if " WARNING " in x or " ERROR " in x]
    assert warnings == [], warnings


def _resign(mirror: Path, rel: str, data: bytes, key: SigningKey) -> None:
    (mirror / rel).write_bytes(data)
    (mirror / f"{rel}.sig").write_bytes(signature_file({key.name: key.sign(rel, data)}))


def test_verdicts_are_signed_the_importing_sites_rules_win_and_old_bundles_still_import(
    sites: Sites, tmp_path: Path
) -> None:
    mirror = sites.export(tmp_path / "admin" / "mirror")
    grant_traversal(mirror / "mirror-info")
    signed = (mirror / MANIFEST).read_bytes()
    doc = json.loads(signed)
    assert doc["verdicts"]["publisher"] == {"trusted": True, "by": "allow"}

    # A verdict changed after signing: the signature no longer holds, the bundle is refused.
    host = sites.import_host("tampered")
    doc["verdicts"]["publisher"]["by"] = "hub"
    (mirror / MANIFEST).write_bytes(json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")
    refused = sites.ctl(host, "mirror", "import", "--from", str(mirror))
    assert refused.rc != 0 and "signature" in refused.stdout + refused.stderr, refused
    assert sites.ctl(host, "ls", "--json").json()["kernels"] == []
    (mirror / MANIFEST).write_bytes(signed)

    # The importing site's deny wins: the kernel is not imported, nor served.
    assert sites.ctl(host, "deny", ACT, "--reason", "not on this site").rc == 0
    denied = sites.ctl(host, "mirror", "import", "--from", str(mirror), "--json")
    assert denied.rc == 1 and "denied on this host" in denied.stdout, denied
    assert denied.json()["publishers_vouched"] == {}

    # "allow-list": this site trusts its own list only, whoever vouched at the exporting site.
    listed = sites.import_host("allow-list", trust={"allow": [], "publishers": "allow-list"})
    assert sites.ctl(listed, "mirror", "import", "--from", str(mirror)).rc == 0
    with listed.kernels() as kernels:
        _, detail = failure(kernels.Resolve, resolve_req(ACT, 1))
        assert detail.code == pb.UNTRUSTED_PUBLISHER, detail

    # An older kerneld's bundle (no verdicts, validly signed) imports; its kernels need this
    # site's [trust] allow, and the refusal says which line to add.
    del doc["verdicts"]
    _resign(mirror, MANIFEST, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", sites.key)
    old = sites.import_host("old-bundle")
    imported = sites.ctl(old, "mirror", "import", "--from", str(mirror), "--json")
    assert imported.rc == 0, imported.stdout + imported.stderr
    assert imported.json()["without_verdicts"] == [ACT]
    with old.kernels() as kernels:
        status, detail = failure(kernels.Resolve, resolve_req(ACT, 1))
        assert status == grpc.StatusCode.PERMISSION_DENIED
        assert detail.code == pb.UNTRUSTED_PUBLISHER
        assert 'allow = ["kerneld-test/*"]' in detail.hint, detail
    # An admin's prefetch of it is refused too, and says how to allow it.
    prefetch = sites.ctl(old, "prefetch", f"{ACT}:1")
    assert prefetch.rc != 0 and 'allow = ["kerneld-test/*"]' in prefetch.stdout, prefetch
    assert "systemctl reload kerneld" in prefetch.stdout, prefetch


def test_prefetch_on_an_import_only_host_reports_what_is_missing_once_not_every_tick(
    sites: Sites, tmp_path: Path
) -> None:
    """`[prefetch] kernels` on a host with no upstream: the timer (every second here) warns
    once about the kernels the store cannot serve and again only when that changes (an
    import); the imported kernel is never reported, and no tick logs a warning of its own."""
    bundle = sites.export(tmp_path / "usb" / "kernels.tar")
    missing = "kerneld-test/not-imported"
    host = sites.import_host(
        "prefetching",
        prefetch={"kernels": [f"{ACT}:1", f"{missing}:1"], "interval": "1s", "on_start": True},
    )
    host.wait_for_log("import-only host (no upstream): 2 of the [prefetch] kernels")
    imported = sites.ctl(host, "mirror", "import", "--from", str(bundle))
    assert imported.rc == 0, imported.stdout + imported.stderr
    host.wait_for_log("import-only host (no upstream): 1 of the [prefetch] kernels")
    ticks = host.logs().count("scheduled prefetch done")
    deadline = time.monotonic() + 30
    while host.logs().count("scheduled prefetch done") < ticks + 4:  # 4 more ticks
        assert time.monotonic() < deadline, host.logs()[-3000:]
        time.sleep(0.2)

    warnings = [x for x in host.logs().splitlines() if " WARNING " in x or " ERROR " in x]
    assert len(warnings) == 2, warnings  # before the import (both), after it (one): no more
    before, after = warnings
    assert f"{ACT}@v1" in before and f"{missing}@v1" in before, before
    assert f"{missing}@v1" in after and f"{ACT}@v1" not in after, after
    assert "kerneldctl mirror import" in after and "fetches nothing" in after, after
    with host.kernels() as kernels:  # the imported kernel is served; nothing was fetched
        assert kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel.path
    assert sites.hub.total() == 0, sites.hub.requests
    assert _inet_sockets(host.pid) == []
