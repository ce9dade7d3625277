"""A job in a container: its own mount namespace, the host's store bind-mounted read-only at
another path (the host path hidden under a tmpfs), the host's socket bind-mounted alone at
another path (no advert), and a home that is read-only. It loads cold (through the daemon) and
warm (published index); with the daemon down it still loads warm; with the store absent it
fails, saying why. In a user namespace where the store's owner is unmapped (`nobody`), the job
trusts the store only when told to.

Real mount namespaces (`unshare -m`, `mount --bind -o ro`, tmpfs), a real daemon as its
unprivileged user. Needs root (mounting), as CI has.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_daemon import ACT, DEP_TOP
from tests.security.support import CPU_FACTS
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINER_STORE = "/mnt/kstore"
CONTAINER_SOCKET = "/mnt/run/kerneld.sock"

JOB = """
import json, sys, kerneld_client
repo = sys.argv[1]
try:
    mod = kerneld_client.get_kernel(repo, version=1, policy="error")
except kerneld_client.KernelError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": exc.message}))
else:
    k = kerneld_client.loaded_kernels()[-1]
    print(json.dumps({"source": k.source, "file": mod.__file__, "path": str(k.path)}))
"""


def _in_container(
    d: DaemonProcess,
    repo: str,
    *,
    user_ns: bool = False,
    store: bool = True,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the job in a new mount namespace (and user namespace) as a container runtime would
    set it up; its printed answer."""
    host = d.store_root.parent
    setup = [
        "mount -t tmpfs tmpfs /mnt",
        f"mkdir {CONTAINER_STORE} /mnt/home /mnt/run",
        "mount -t tmpfs -o ro tmpfs /mnt/home",  # images often have a read-only home
        # The socket alone, at another path: no advert beside it (the host's is hidden).
        f"touch {CONTAINER_SOCKET}",
        f"{{ [ ! -S {shlex.quote(str(d.user_socket))} ] || "  # a stopped daemon has none
        f"mount --bind {shlex.quote(str(d.user_socket))} {CONTAINER_SOCKET}; }}",
        f"mount -t tmpfs tmpfs {shlex.quote(str(d.user_socket.parent))}",
    ]
    if store:
        setup += [
            f"mount --bind {shlex.quote(str(d.store_root))} {CONTAINER_STORE}",
            f"mount -o remount,bind,ro {CONTAINER_STORE}",
        ]
    setup.append(f"mount -t tmpfs tmpfs {shlex.quote(str(host))}")  # the host path is gone
    job = shlex.join([sys.executable, "-c", JOB, repo])
    script = " && ".join([*setup, f"exec {job}"])
    unshare = ["unshare", "-m", "--propagation", "private"]
    if user_ns:
        # Map only root: the store's owner (the daemon's user on the host) shows up as nobody.
        unshare = ["unshare", "-U", "-r", "-m", "--propagation", "private"]
    job_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'client'}",
        "HOME": "/mnt/home",
        "KERNELD_STORE": CONTAINER_STORE,
        "KERNELD_SOCKET": CONTAINER_SOCKET,
        "KERNELD_PLATFORM_JSON": CPU_FACTS,
        **(env or {}),
    }
    proc = subprocess.run(
        [*unshare, "sh", "-c", script],
        env=job_env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"the job printed nothing (rc {proc.returncode}):\n{proc.stderr}"
    out: dict[str, Any] = json.loads(lines[-1])
    out["stderr"] = proc.stderr
    return out


@pytest.fixture
def daemon(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> DaemonProcess:
    (tmp_path / "host").mkdir()
    return make_daemon(mirror_dirs=[kernel_mirror], store=tmp_path / "host" / "store")


def _owner(d: DaemonProcess) -> dict[str, str]:
    """What a container without the host's passwd is told: the store owner's numeric uid."""
    return {"KERNELD_STORE_OWNER": str(d.store_root.stat().st_uid)}


def test_a_container_job_loads_cold_then_warm(daemon: DaemonProcess, tmp_path: Path) -> None:
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    cold = _in_container(daemon, ACT, env={**_owner(daemon), "TMPDIR": str(job_tmp)})
    assert cold.get("source") == "daemon", cold
    assert cold["path"].startswith(f"{CONTAINER_STORE}/"), cold
    # A read-only home: the compiled bytecode went to a private folder in the temp directory.
    assert list((job_tmp / "kerneld-0" / "bytecode").iterdir())
    warm = _in_container(daemon, ACT, env=_owner(daemon))
    assert warm.get("source") == "index", warm
    assert warm["path"].startswith(f"{CONTAINER_STORE}/")
    # Dependencies come through the daemon's answer too.
    deps = _in_container(daemon, DEP_TOP, env=_owner(daemon))
    assert deps.get("source") == "daemon", deps


def test_a_container_job_without_the_daemon(daemon: DaemonProcess) -> None:
    assert _in_container(daemon, ACT, env=_owner(daemon)).get("source") == "daemon"
    daemon.stop()
    assert _in_container(daemon, ACT, env=_owner(daemon)).get("source") == "index"
    missing = _in_container(daemon, DEP_TOP, env=_owner(daemon))
    assert missing.get("error") == "DaemonUnavailable", missing


def test_a_container_without_the_store_says_so(daemon: DaemonProcess) -> None:
    out = _in_container(daemon, ACT, store=False, env=_owner(daemon))
    assert out.get("error") == "KernelUnavailable", out
    assert f"{CONTAINER_STORE} (this process's store root) holds no v1/trees/" in out["message"]


def test_a_user_namespace_trusts_an_unmapped_owner_only_when_told(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    # Root in a user namespace has no say over the host's files: the socket must let others in
    # (or a group mapped into the namespace).
    (tmp_path / "host").mkdir()
    daemon = make_daemon(
        mirror_dirs=[kernel_mirror],
        store=tmp_path / "host" / "store",
        config={"sockets": {"user_mode": "0666"}},
    )
    # The store's owner maps to nobody: the job cannot tell the daemon's user from any other
    # unmapped user, so it refuses the store unless told that nobody owns it.
    refused = _in_container(daemon, ACT, user_ns=True)
    assert refused.get("error") == "UntrustedPath", refused
    assert "owned by uid 65534" in refused["message"]
    nobody = {"KERNELD_STORE_OWNER": "65534"}
    assert _in_container(daemon, ACT, user_ns=True, env=nobody).get("source") == "daemon"
    assert _in_container(daemon, ACT, user_ns=True, env=nobody).get("source") == "index"
