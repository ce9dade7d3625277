"""The image recipe (deploy/image/) built and run as the DaemonSet runs it, on a fresh node.

`deploy/image/build.py` builds the daemon image and the example job image with podman, offline,
on a Debian 12 base made with mmdebstrap (the root file system cached in the suite's cache outside
the clone, tests/support/testcache.py, the image store too, so only the first run on a machine
pays for the base and the wheels; $KERNELD_IMAGE_CACHE moves it). Then, with the flags
*read from* deploy/kubernetes/ (no capability, read-only root, no new privileges, the manifest's
uid; the init container as root with only its added capabilities):

- the node's host directories are root-owned 0755, as the kubelet makes them: the daemon alone
  refuses to start and says which directory and what to do;
- the init container makes them the daemon's; the daemon (the ConfigMap's kerneld.toml, its Hub
  upstream the Hub test server on loopback) answers the manifest's startup probe;
- a job pod (job-pod.yaml's mounts, variables and supplementalGroups, another uid) in the job
  image loads a real torch kernel cold (the daemon fetches it) and warm (the published index, no
  Hub request), checking the kernel's output against PyTorch; one outside the socket's group
  can read neither the socket nor the store, and says so.

Real podman (rootful, as CI runs; host networking, so loopback is the host's). This sandbox's
quirks are settled in the containers.conf written here: runc where cgroups are hybrid (crun
refuses them), ulimits the runtime may set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from tests.support.hubserver import HubServer

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman and root-owned host dirs"),
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
KERNEL = f"{ORG}/activation"
JOB_UID = 2000  # not the daemon's, not root

sys.path.insert(0, str(REPO / "deploy" / "image"))
import build as recipe  # noqa: E402  (deploy/image/build.py: not a package)

from tests.containers.podman import ENV, build_images, podman_env  # noqa: E402

JOB = """
import json, torch
from kerneld_client import get_kernel, loaded_kernels
act = get_kernel({kernel!r}, version=1)
x = torch.randn(8, 64)
got, want = act.silu_and_mul_alloc(x), torch.nn.functional.silu(x[:, :32]) * x[:, 32:]
(k,) = loaded_kernels()
print(json.dumps({{"max_err": float((got - want).abs().max()), "shape": list(got.shape),
                  "source": k.source, "path": str(k.path)}}))
"""


# ---- podman, set up for this machine (tests/containers/podman.py) --------------------------


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Both images, built by the recipe as a site would run it (`make test-deps` built the
    base and the wheels; this build adds this checkout's wheels)."""
    built = build_images()
    ENV.update(podman_env())
    podman("image", "prune", "--force")  # the layers of earlier builds, in the cached store
    return built


# ---- the manifests, as podman flags ---------------------------------------------------------


def _docs(name: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d}


DAEMONSET = _docs("kerneld-daemonset.yaml")
POD = DAEMONSET["DaemonSet"]["spec"]["template"]["spec"]
JOB_POD = _docs("job-pod.yaml")["Pod"]["spec"]


def run_flags(container: dict[str, Any], pod: dict[str, Any], volumes: dict[str, str]) -> list[str]:
    """`podman run` flags for a manifest's container: its user, security context, env and
    mounts (`volumes`: volume name -> host path, or "tmpfs" for an emptyDir)."""
    sec = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    flags = ["--network=host", "--pull=never"]
    if "runAsUser" in sec:
        flags.append(f"--user={sec['runAsUser']}:{sec.get('runAsGroup', sec['runAsUser'])}")
    flags += [f"--group-add={g}" for g in sec.get("supplementalGroups", [])]
    if sec.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if sec.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    caps = sec.get("capabilities", {})
    assert caps.get("drop") in (None, ["ALL"]), caps
    if caps.get("drop") == ["ALL"]:
        flags.append("--cap-drop=all")
    flags += [f"--cap-add={c}" for c in caps.get("add", [])]
    assert not sec.get("privileged")
    flags += [f"--env={e['name']}={e['value']}" for e in container.get("env", [])]
    for m in container.get("volumeMounts", []):
        host = volumes[m["name"]]
        if host == "tmpfs":
            flags.append(f"--tmpfs={m['mountPath']}:rw,mode=1777")
        else:
            flags.append(f"--volume={host}:{m['mountPath']}:{'ro' if m.get('readOnly') else 'rw'}")
    return flags


@pytest.fixture
def hub(example_hub: HubRoot) -> Iterator[HubServer]:
    with HubServer(example_hub.root, trusted_orgs={ORG: True}) as server:
        yield server


def on_node(node: dict[str, str], host_path: str) -> str:
    """Where the node's `host_path` is on this machine."""
    return str(Path(node["root"]) / host_path.strip("/"))


@pytest.fixture
def node(tmp_path: Path, hub: HubServer) -> dict[str, str]:
    """A fresh node: the DaemonSet's hostPath directories root-owned 0755 (as the kubelet makes
    them), and the ConfigMap's kerneld.toml (its prefetch list dropped: those kernels are on the
    real Hub) as the config volume."""
    vols: dict[str, str] = {"root": str(tmp_path / "node")}
    for v in POD["volumes"]:
        if "hostPath" in v:
            path = Path(on_node(vols, v["hostPath"]["path"]))
            path.mkdir(parents=True, mode=0o755)
            os.chown(path, 0, 0)
            vols[v["name"]] = str(path)
        elif "emptyDir" in v:
            vols[v["name"]] = "tmpfs"
    config = tmp_path / "config"
    config.mkdir(mode=0o755)
    toml = DAEMONSET["ConfigMap"]["data"]["kerneld.toml"]
    toml = re.sub(r"^\[prefetch\]\n(?:[^\[\n].*\n)*", "", toml, flags=re.MULTILINE)
    assert "prefetch" not in toml and "[trust]" in toml, toml
    (config / "kerneld.toml").write_text(toml)
    os.chmod(config / "kerneld.toml", 0o644)
    vols["config"] = str(config)
    vols["hub"] = hub.url
    return vols


def _daemon_argv(node: dict[str, str], image: str, name: str, *, detach: bool = False) -> list[str]:
    (daemon,) = POD["containers"]
    return [
        "run", *(["--detach"] if detach else []), f"--name={name}", *run_flags(daemon, POD, node),
        f"--env=HF_ENDPOINT={node['hub']}", image, *daemon["command"],
    ]  # fmt: skip


def test_the_daemon_on_an_unprepared_node_says_which_directory_and_what_to_do(
    images: dict[str, str], node: dict[str, str]
) -> None:
    name = f"kerneld-test-{uuid.uuid4().hex[:8]}"
    try:
        done = podman(*_daemon_argv(node, images["daemon"], name), check=False, timeout=60)
    finally:
        podman("rm", "--force", name, check=False)
    assert done.returncode != 0, done.stdout + done.stderr
    uid = POD["securityContext"]["runAsUser"]
    err = done.stderr
    assert "Permission denied" in err and "/run/kerneld" in err, err
    assert f"chown {uid}:{uid} /run/kerneld" in err and "init container" in err, err


def test_the_daemonset_on_a_fresh_node_serves_a_job_cold_and_warm(
    images: dict[str, str], node: dict[str, str], hub: HubServer
) -> None:
    uid = POD["securityContext"]["runAsUser"]
    assert uid == recipe.kerneld_uid() != JOB_UID

    # The init container: root with CHOWN and FOWNER only, the rest as the daemon's.
    (init,) = POD["initContainers"]
    podman("run", "--rm", *run_flags(init, POD, node), images["daemon"], *init["command"])
    for mount in ("store", "run"):
        st = Path(node[mount]).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, uid, 0o755), mount

    name = f"kerneld-test-{uuid.uuid4().hex[:8]}"
    podman(*_daemon_argv(node, images["daemon"], name, detach=True))
    try:
        (daemon,) = POD["containers"]
        probe = daemon["startupProbe"]["exec"]["command"]
        deadline = time.monotonic() + 60
        while (ready := podman("exec", name, *probe, check=False)).returncode != 0:
            state = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            logs = podman("logs", name, check=False)
            assert state == "true", f"the daemon exited:\n{logs.stdout}{logs.stderr}"
            assert time.monotonic() < deadline, f"not ready in 60 s:\n{ready.stdout}{ready.stderr}"
            time.sleep(0.5)

        # A job pod: job-pod.yaml's env, mounts and groups, the example job image, another uid.
        (job,) = JOB_POD["containers"]
        job_vols = {v["name"]: on_node(node, v["hostPath"]["path"]) for v in JOB_POD["volumes"]}
        job_flags = [
            f"--user={JOB_UID}:{JOB_UID}", "--read-only", "--cap-drop=all",
            "--security-opt=no-new-privileges", "--tmpfs=/tmp:rw,mode=1777",
            *run_flags(job, JOB_POD, job_vols),
        ]  # fmt: skip

        def load() -> dict[str, Any]:
            done = podman("run", "--rm", *job_flags, images["job"], "python3", "-c",
                          JOB.format(kernel=KERNEL), timeout=180)  # fmt: skip
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))

        hub.reset_counts()
        cold = load()
        assert cold["source"] == "daemon", cold
        assert cold["max_err"] < 1e-5 and cold["shape"] == [8, 32], cold
        assert cold["path"].startswith("/var/lib/kerneld/store/v1/trees/"), cold
        assert hub.total() > 0, "the cold load did not reach the Hub"
        print(f"cold: {cold}")
        hub.reset_counts()
        warm = load()
        assert warm["source"] == "index", warm
        assert warm["max_err"] < 1e-5, warm
        assert hub.total() == 0, f"the warm load asked the Hub: {hub.path_counts}"
        # Outside the socket's group (no supplementalGroups) a job gets neither the socket nor
        # the store (0750, the socket's group): it fails, saying so.
        outsider = [f for f in job_flags if not f.startswith("--group-add")]
        assert len(outsider) == len(job_flags) - 1
        denied = podman("run", "--rm", *outsider, images["job"], "python3", "-c",
                        JOB.format(kernel=KERNEL), timeout=180, check=False)  # fmt: skip
        assert denied.returncode != 0, denied.stdout
        assert "no permission to read the host's kernel store" in denied.stderr, denied.stderr
        # The store on the node is the daemon's uid's, as the job pods' KERNELD_STORE_OWNER says.
        store = Path(node["store"]) / "store"
        assert store.stat().st_uid == uid
        env = {e["name"]: e["value"] for e in job["env"]}
        assert env["KERNELD_STORE_OWNER"] == str(uid)
    finally:
        logs = podman("logs", name, check=False)
        podman("rm", "--force", "--time=5", name, check=False)
    assert "Traceback" not in logs.stderr, logs.stderr


def test_the_init_container_stops_at_a_store_of_another_uid(
    images: dict[str, str], node: dict[str, str]
) -> None:
    """A node whose store a kerneld of another uid made (a host install numbered before the
    fixed uid): the init container refuses, naming both uids, instead of a daemon failing later."""
    store = Path(node["store"]) / "store"
    store.mkdir(mode=0o750)
    os.chown(store, 993, 993)
    (init,) = POD["initContainers"]
    done = podman(
        "run", "--rm", *run_flags(init, POD, node), images["daemon"], *init["command"], check=False
    )
    uid = POD["securityContext"]["runAsUser"]
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"belongs to uid 993, not {uid}" in done.stderr and "chown -R" in done.stderr, (
        done.stderr
    )
    assert store.stat().st_uid == 993  # left as it was
