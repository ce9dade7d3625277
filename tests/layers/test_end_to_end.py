"""LayerRepository and LockedLayerRepository end to end: a store filled by the daemon's code
(verified ingest, published index), read by the client's warm path in a fresh process
with no daemon running; then the administrator denies the kernel."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from examples.mirror import build_example_mirror
from kerneld.mirror.upstream import MirrorDirUpstream
from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.store import Store
from kerneld_client.platform import detect_platform_facts
from tests.support import zygote
from tests.support.daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
REPO = "kerneld-examples/activation"
VERSION = 2  # v1 builds are imported in-process by other layer tests; a child has its own


@pytest.fixture(scope="module")
def v2_store(
    built_examples: BuiltExamples, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    mirror = build_example_mirror(built=built_examples)
    root = tmp_path_factory.mktemp("layers-e2e") / "store"
    with Store.open(root, min_age_s=0) as store:
        resolver = Resolver(store, [MirrorDirUpstream(mirror.root, name="examples")])
        res = resolver.resolve(
            KernelSpec(REPO, version=VERSION), detect_platform_facts(probe_devices=False)
        )
    assert res.commit == mirror.repos[REPO][f"v{VERSION}"]
    return root, res.commit


@pytest.fixture
def store(v2_store: tuple[Path, str], tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(v2_store[0], root, symlinks=True)
    return root


def child(
    store: Path, tmp: Path, *, extra_env: dict[str, str] | None = None, **args: object
) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KERNELD_", "HF_", "LOCAL_KERNELS"))
    }
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_RUNTIME_DIR=str(home / "run"),
        KERNELD_STORE=str(store),
        KERNELD_SOCKET=str(tmp / "no-daemon" / "kerneld.sock"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra_env or {})
    out = zygote.run_python(
        ["-m", "tests.layers._e2e_child", json.dumps({"version": VERSION, **args})],
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    result["stderr"] = out.stderr
    return result


def test_hub_layers_from_the_store_without_a_daemon(
    store: Path, v2_store: tuple[Path, str], built_examples: BuiltExamples, tmp_path: Path
) -> None:
    result = child(store, tmp_path)
    layers = result["report"]["layers"]
    assert len(layers) == 6 * 3 + 1
    assert {e["status"] for e in layers} == {"kernelized"}, layers[0]
    assert {(e["repo"], e["revision"], e["commit"]) for e in layers} == {
        (REPO, f"v{VERSION}", v2_store[1])
    }
    assert {e["variant"] for e in layers} == {built_examples.arch_variant}
    assert result["max_err"] < 1e-4
    assert len(result["loads"]) == 1  # one (repo, version) for 19 layer instances
    assert result["grpc"] is False  # warm path: the published index, no RPC


def test_locked_layer_repository(store: Path, v2_store: tuple[Path, str], tmp_path: Path) -> None:
    lockfile = tmp_path / "kernels.lock"
    lock = [{"dependency": {"repo-id": REPO, "version": VERSION}, "lock": {"commit": v2_store[1]}}]
    lockfile.write_text(json.dumps(lock))
    result = child(store, tmp_path, locked=str(lockfile))
    norms = [e for e in result["report"]["layers"] if e["layer_name"] == "RMSNorm"]
    assert {e["status"] for e in norms} == {"kernelized"}
    assert {(e["revision"], e["commit"]) for e in norms} == {(v2_store[1], v2_store[1])}
    assert len(result["loads"]) == 2  # the locked commit and the v2 ref: two requests


def test_locked_repository_with_another_commit_falls_back(store: Path, tmp_path: Path) -> None:
    lockfile = tmp_path / "kernels.lock"
    other = "0" * 40
    lock = [{"dependency": {"repo-id": REPO, "version": VERSION}, "lock": {"commit": other}}]
    lockfile.write_text(json.dumps(lock))
    result = child(store, tmp_path, locked=str(lockfile))
    norms = [e for e in result["report"]["layers"] if e["layer_name"] == "RMSNorm"]
    assert {(e["status"], e["revision"]) for e in norms} == {("fallback", other)}
    assert {e["cause"] for e in norms} == {"daemon-unavailable"}  # not in the index: ask kerneld
    silu = [e for e in result["report"]["layers"] if e["layer_name"] == "SiluAndMul"]
    assert {e["status"] for e in silu} == {"kernelized"}
    assert result["max_err"] < 1e-4


def test_disable_by_commit(store: Path, v2_store: tuple[Path, str], tmp_path: Path) -> None:
    result = child(store, tmp_path, extra_env={"KERNELD_DISABLE": f"{REPO}@{v2_store[1]}"})
    layers = result["report"]["layers"]
    assert {(e["status"], e["cause"]) for e in layers} == {("disabled", "KERNELD_DISABLE")}
    assert result["max_err"] == 0.0


def test_denied_by_the_administrator(store: Path, tmp_path: Path) -> None:
    with Store.open(store, min_age_s=0) as s:
        s.names.deny(REPO, reason="security advisory 42")
    result = child(store, tmp_path)
    layers = result["report"]["layers"]
    assert {(e["status"], e["cause"]) for e in layers} == {("fallback", "denied")}
    reason = layers[0]["reason"]
    assert reason.startswith("denied by the host administrator"), reason
    assert "security advisory 42" in reason
    assert result["max_err"] == 0.0
    assert "denied by the host administrator" in result["stderr"]  # the warning
    assert result["grpc"] is False


def test_hub_layers_through_a_running_daemon(
    make_daemon: Callable[..., DaemonProcess],
    built_examples: BuiltExamples,
    tmp_path: Path,
) -> None:
    """Cold store: the index misses, the client asks the real daemon over its socket, the
    daemon fetches and verifies the kernel from the mirror, the layers are kernelized."""
    mirror = build_example_mirror(built=built_examples)
    daemon = make_daemon(mirror_dirs=[mirror.root])
    result = child(
        daemon.store_root,
        tmp_path,
        extra_env={"KERNELD_SOCKET": str(daemon.user_socket)},
    )
    layers = result["report"]["layers"]
    assert {e["status"] for e in layers} == {"kernelized"}, layers[0]
    assert {(e["revision"], e["commit"]) for e in layers} == {
        (f"v{VERSION}", mirror.repos[REPO][f"v{VERSION}"])
    }
    assert {e["variant"] for e in layers} == {built_examples.arch_variant}
    assert result["grpc"] is True  # this time the daemon had to be asked
    assert len(result["loads"]) == 1
    assert result["max_err"] < 1e-4
    # A second process finds the published index: no RPC at all.
    again = child(
        daemon.store_root, tmp_path, extra_env={"KERNELD_SOCKET": str(daemon.user_socket)}
    )
    assert {e["status"] for e in again["report"]["layers"]} == {"kernelized"}
    assert again["grpc"] is False
