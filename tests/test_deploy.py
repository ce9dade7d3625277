"""The Kubernetes manifests in deploy/kubernetes/ hold together: they parse, the daemon's
configuration (the ConfigMap) is valid kerneld.toml whose paths are the mounted host paths, the
DaemonSet is as tight as the systemd unit (non-root, no privilege, no capabilities, read-only
root), it has probes that ask the daemon, and a job pod mounts the same store read-only and
the same socket directory, trusting the daemon's uid."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kerneld.config import ConfigError, load_config

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


def _docs(name: str) -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    return {d["kind"]: d for d in docs}


def _host_paths(spec: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container["volumeMounts"]}


def test_the_daemonset_runs_kerneld_as_tightly_as_the_unit(tmp_path: Path) -> None:
    docs = _docs("kerneld-daemonset.yaml")
    assert {"Namespace", "ConfigMap", "DaemonSet"} <= docs.keys()
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    (daemon,) = pod["containers"]
    sec, pod_sec = daemon["securityContext"], pod["securityContext"]
    assert pod_sec["runAsNonRoot"] is True and pod_sec["runAsUser"] != 0
    assert pod_sec["seccompProfile"]["type"] == "RuntimeDefault"
    assert sec["privileged"] is False and sec["allowPrivilegeEscalation"] is False
    assert sec["capabilities"]["drop"] == ["ALL"] and "add" not in sec["capabilities"]
    assert sec["readOnlyRootFilesystem"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    assert daemon["resources"]["limits"]["memory"] == "1Gi"  # the unit's MemoryMax
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert daemon[probe]["exec"]["command"][:2] == ["kerneldctl", "status"], probe

    # Its configuration loads, and its store and sockets are on the node's host paths.
    toml = tmp_path / "kerneld.toml"
    toml.write_text(docs["ConfigMap"]["data"]["kerneld.toml"])
    cfg = load_config(toml, env={})
    assert cfg.system and cfg.trust_publishers == "hub"
    mounts, hosts = _mounts(daemon), _host_paths(pod)
    config_dir = daemon["command"][daemon["command"].index("--config") + 1]
    assert Path(config_dir).parent == Path(mounts["config"]["mountPath"])
    assert cfg.store_path.is_relative_to(mounts["store"]["mountPath"])
    assert cfg.user_socket.path.parent == Path(mounts["run"]["mountPath"])
    assert cfg.admin_socket.path.parent == Path(mounts["run"]["mountPath"])
    assert cfg.admin_socket.mode == 0o600  # administration stays on the node
    assert hosts == {"store": "/var/lib/kerneld", "run": "/run/kerneld"}


def test_a_job_pod_mounts_the_store_read_only_and_trusts_the_daemons_uid(tmp_path: Path) -> None:
    docs = _docs("kerneld-daemonset.yaml")
    daemonset = docs["DaemonSet"]["spec"]["template"]["spec"]
    toml = tmp_path / "kerneld.toml"
    toml.write_text(docs["ConfigMap"]["data"]["kerneld.toml"])
    store_path = load_config(toml, env={}).store_path
    (daemon,) = daemonset["containers"]
    in_mount = store_path.relative_to(_mounts(daemon)["store"]["mountPath"])
    host_store = Path(_host_paths(daemonset)["store"]) / in_mount
    pod = _docs("job-pod.yaml")["Pod"]["spec"]
    (job,) = pod["containers"]
    env = {e["name"]: e["value"] for e in job["env"]}
    mounts, hosts = _mounts(job), _host_paths(pod)
    store = mounts["kerneld-store"]
    assert store["readOnly"] is True and env["KERNELD_STORE"] == store["mountPath"]
    assert Path(hosts["kerneld-store"]) == host_store
    assert Path(env["KERNELD_SOCKET"]).parent == Path(mounts["kerneld-run"]["mountPath"])
    assert hosts["kerneld-run"] == _host_paths(daemonset)["run"]
    assert env["KERNELD_STORE_OWNER"] == str(daemonset["securityContext"]["runAsUser"])
    assert not job.get("securityContext", {}).get("privileged")


# ---- the image recipe, the init container and the uid (issue 43) ----------------------------

IMAGE_DIR = DEPLOY.parent / "image"
sys.path.insert(0, str(IMAGE_DIR))
import build as recipe  # noqa: E402  (deploy/image/build.py: not a package)


def test_the_manifests_run_the_image_the_recipe_builds_as_the_sysusers_uid() -> None:
    docs = _docs("kerneld-daemonset.yaml")
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    uid = recipe.kerneld_uid()  # the fixed uid of systemd/kerneld.sysusers
    assert uid == 989
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == uid
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["image"] == recipe.DAEMON_IMAGE, container["name"]
    # The Containerfile's user defaults to the same uid (build.py passes it too).
    containerfile = (IMAGE_DIR / "Containerfile").read_text()
    assert (
        f"ARG KERNELD_UID={uid}\n" in containerfile and f"ARG KERNELD_GID={uid}\n" in containerfile
    )
    assert "USER ${KERNELD_UID}:${KERNELD_GID}" in containerfile
    # A job pod trusts that uid and joins the socket's group: the daemon's own, mode 0660.
    job = _docs("job-pod.yaml")["Pod"]["spec"]
    (train,) = job["containers"]
    assert {e["name"]: e["value"] for e in train["env"]}["KERNELD_STORE_OWNER"] == str(uid)
    assert job["securityContext"]["supplementalGroups"] == [uid]
    toml = docs["ConfigMap"]["data"]["kerneld.toml"]
    assert 'user_mode = "0660"' in toml and 'user_group = ""' in toml


def test_the_init_container_prepares_the_host_dirs_as_root_with_only_chown_and_fowner() -> None:
    pod = _docs("kerneld-daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (daemon,) = pod["containers"]
    sec = init["securityContext"]
    assert sec["runAsUser"] == 0 and sec["runAsNonRoot"] is False
    assert sec["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert sec["allowPrivilegeEscalation"] is False and sec["privileged"] is False
    assert sec["readOnlyRootFilesystem"] is True
    # It prepares exactly the daemon's hostPath mounts, for the daemon's uid.
    host_mounts = {
        name: m["mountPath"] for name, m in _mounts(daemon).items() if name in _host_paths(pod)
    }
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == host_mounts
    script = init["command"][-1]
    uid = pod["securityContext"]["runAsUser"]
    for path in host_mounts.values():
        assert path in script
    assert f"chown {uid}:{uid}" in script and "chmod 0755" in script


def test_the_namespace_admits_hostpath_pods_and_metrics_reach_the_cluster(tmp_path: Path) -> None:
    """Pod Security admission refuses hostPath below "privileged": the namespace says so
    (enforce, and warn/audit so no level below it reports the pods); the daemon's metrics
    listen on the pod's IP, which the configuration allows only with allow_remote."""
    docs = _docs("kerneld-daemonset.yaml")
    labels = docs["Namespace"]["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged", mode
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert _host_paths(pod)  # why: hostPath is what needs it
    (daemon,) = pod["containers"]
    toml = tmp_path / "kerneld.toml"
    text = docs["ConfigMap"]["data"]["kerneld.toml"]
    toml.write_text(text)
    cfg = load_config(toml, env={})
    assert cfg.metrics_allow_remote and cfg.metrics_listen.startswith("0.0.0.0:")
    port = int(cfg.metrics_listen.rpartition(":")[2])
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in daemon["ports"]
    # Without allow_remote the same listen address is refused, naming the key to set.
    toml.write_text(text.replace("allow_remote = true", "allow_remote = false"))
    with pytest.raises(ConfigError, match="allow_remote = true"):
        load_config(toml, env={})
    env = {e["name"]: e["value"] for e in daemon["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert "nvidia.com/gpu" not in str(daemon.get("resources", {}))  # no GPU taken from jobs
