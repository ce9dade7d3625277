"""The RPC path against the real daemon (tests/support/daemon.py): cold loads fetched by the
daemon, typed errors from its trailers, kernel-depends in its order, fork safety, and the warm
path in a fresh process after the daemon was stopped."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.support import (
    ACTIVATION,
    IN_CHILD,
    OPS_CHECK,
    RELU2,
    client_env,
    run_client,
)
from tests.fixtures_daemon import ACT, DEP_BOTTOM, DEP_TOP
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

PRELUDE = (
    "import json, os, sys, time, warnings\n"
    + OPS_CHECK
    + IN_CHILD
    + """
import kerneld_client
from kerneld_client import loaded_kernels


def sockets():
    '''Open unix/TCP sockets of this process (a leftover gRPC channel would show up here).'''
    out = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                out += 1
        except OSError:
            pass
    return out
"""
)

#: The variant rules' modules: the daemon ranks, so neither path of a plain load imports them.
RULES = {
    "kerneld_client.variants.choice",
    "kerneld_client.variants.facts",
    "kerneld_client.variants.names",
}


@pytest.fixture
def hub_daemon(
    make_daemon: Callable[..., DaemonProcess], example_server: HubServer
) -> DaemonProcess:
    example_server.reset()
    return make_daemon(hub_endpoint=example_server.url)


def _env(daemon: DaemonProcess, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A client that finds the store through the daemon's advert (unless KERNELD_STORE is
    given in `extra`)."""
    env = client_env(None, tmp_path, KERNELD_SOCKET=str(daemon.user_socket), **extra)
    assert ("KERNELD_STORE" in env) == ("KERNELD_STORE" in extra)
    return env


def test_cold_load_through_the_daemon_then_warm(
    hub_daemon: DaemonProcess, example_server: HubServer, tmp_path: Path
) -> None:
    env = _env(hub_daemon, tmp_path)
    script = (
        PRELUDE
        + f"""
before = sockets()
t = time.perf_counter()
m = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
took = time.perf_counter() - t
info = loaded_kernels()[0]
print(json.dumps({{"ops": check_activation(m, 1), "source": info.source, "took": took,
                  "path": str(info.path), "grpc": "grpc" in sys.modules,
                  "rules": sorted(set(sys.modules) & {RULES!r}),
                  "sockets_before": before, "sockets_after": sockets()}}))
"""
    )
    cold = run_client(script, env)
    assert cold["ops"] == ["silu_and_mul", "gelu_tanh_and_mul", "rms_norm"]
    assert cold["source"] == "daemon" and cold["grpc"] is True
    # The RPC sends the platform as detected: the variant rules (milliseconds to import) and
    # their dataclasses stay out of a process that only asks the daemon.
    assert cold["rules"] == []
    assert Path(cold["path"]).is_relative_to(hub_daemon.store_root.resolve())
    assert cold["sockets_after"] == cold["sockets_before"], "a gRPC channel was left open"
    fetched = [r.path for r in example_server.requests if r.kind == "resolve_get"]
    assert any(p.endswith(".so") for p in fetched), "the daemon did not download the kernel"

    example_server.reset_counts()
    warm = run_client(script, env)
    assert warm["ops"] == cold["ops"] and warm["path"] == cold["path"]
    assert warm["source"] == "index" and warm["grpc"] is False
    assert example_server.total() == 0


def test_warm_load_after_the_daemon_was_stopped(
    hub_daemon: DaemonProcess, example_server: HubServer, tmp_path: Path
) -> None:
    env = _env(hub_daemon, tmp_path)
    run_client(
        PRELUDE
        + f"""
kerneld_client.get_kernel("{ACTIVATION}", version=2, policy="error")
kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
print(json.dumps({{}}))
""",
        env,
    )
    assert hub_daemon.stop(signal.SIGTERM) == 0
    assert not hub_daemon.user_socket.exists()
    example_server.reset_counts()
    # The daemon removed its advert: the process is told where the store is, as a system
    # install would find /var/lib/kerneld/store.
    env["KERNELD_STORE"] = str(hub_daemon.store_root)
    out = run_client(
        PRELUDE
        + f"""
a = kerneld_client.get_kernel("{ACTIVATION}", version=2, policy="error")
r = kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
print(json.dumps({{"a": check_activation(a, 2), "r": check_relu2(r), "grpc": "grpc" in sys.modules,
                  "src": [k.source for k in loaded_kernels()]}}))
""",
        env,
    )
    assert out["a"][-1] == "gelu_and_mul" and out["r"] == ["relu2"]
    assert out["src"] == ["index", "index"] and out["grpc"] is False
    assert example_server.total() == 0


def test_a_child_forked_after_an_rpc_never_uses_grpc(
    hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """gRPC can hang for ever in a child forked after it was used (0.3-0.8% of such children
    hung creating a channel, under load): such a child never asks the daemon. It uses the
    parent's kernel and what the published index has; anything else is DaemonUnavailable at
    once, with what to do instead. The parent's own RPCs go on, and no channel survives one."""
    env = _env(hub_daemon, tmp_path)
    run_client(  # another process has published activation v1 in the index
        PRELUDE + f'kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")\n'
        "print('{}')\n",
        env,
    )
    out = run_client(
        PRELUDE
        + f"""
import time
relu = kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
assert loaded_kernels()[0].source == "daemon" and "grpc" in sys.modules
open_after_rpc = sockets()
def child():
    act = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
    res = {{"ops": check_activation(act, 1), "relu": check_relu2(relu),
           "src": [k.source for k in loaded_kernels()]}}
    t0 = time.monotonic()
    try:
        kerneld_client.get_kernel("{ACTIVATION}", version=2, policy="error")
    except kerneld_client.DaemonUnavailable as exc:
        res.update(refused=str(exc), refused_s=time.monotonic() - t0)
    return res
child = in_child(child)
v2 = kerneld_client.get_kernel("{ACTIVATION}", version=2, policy="error")
print(json.dumps({{"child": child, "parent_v2": check_activation(v2, 2),
                  "parent_src": [k.source for k in loaded_kernels()],
                  "open_after_rpc": open_after_rpc, "open_at_end": sockets()}}))
""",
        env,
    )
    assert "error" not in out["child"], out["child"]
    child = out["child"]["ok"]
    assert child["ops"][0] == "silu_and_mul" and child["relu"] == ["relu2"]
    assert child["src"] == ["daemon", "index"]  # the parent's relu2; activation v1 from the index
    assert "forked from one that had imported gRPC" in child["refused"]
    assert "'spawn' or 'forkserver'" in child["refused"]  # what to do instead
    assert child["refused_s"] < 0.5  # at once: no probe, no channel
    assert out["parent_v2"][-1] == "gelu_and_mul" and out["parent_src"][-1] == "daemon"
    assert out["open_at_end"] == out["open_after_rpc"] == 0


def test_a_child_forked_after_another_library_imported_grpc_never_uses_it(
    hub_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The same guard when kerneld never made an RPC in the parent but another library had
    grpc in use at the fork (a channel of its own, as Ray or a cloud SDK keeps): the child
    is refused at once, without a channel; the parent asks kerneld as before."""
    env = _env(hub_daemon, tmp_path)
    out = run_client(
        PRELUDE
        + f"""
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
channel = grpc.insecure_channel("unix:" + os.environ["KERNELD_SOCKET"])
health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
assert "kerneld_client._rpc" not in sys.modules
def child():
    t0 = time.monotonic()
    try:
        kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
        return {{"loaded": True}}
    except kerneld_client.DaemonUnavailable as exc:
        return {{"refused": str(exc), "refused_s": time.monotonic() - t0}}
child = in_child(child)
relu = kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
print(json.dumps({{"child": child, "health": health.status,
                  "parent": check_relu2(relu), "src": loaded_kernels()[0].source}}))
""",
        env,
    )
    assert "ok" in out["child"], out["child"]
    child = out["child"]["ok"]
    assert out["health"] == 1  # SERVING: the other library's channel really was in use
    assert "forked from one that had imported gRPC" in child["refused"], child
    assert child["refused_s"] < 0.5
    assert out["parent"] == ["relu2"] and out["src"] == "daemon"


def test_typed_errors_and_dependencies_from_the_daemon(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    """Against a mirror upstream: kernel-depends come back in import order; a kernel with only
    CUDA builds is NoCompatibleVariant with every reason (from the ErrorDetail trailer); an
    unknown repo is KernelNotFound; a deny made through the admin socket is KernelDenied; a
    mapping naming a version or a revision the repo lacks makes kernelize raise."""
    from kerneld_client.proto import kerneld_pb2

    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    env = _env(daemon, tmp_path)
    with daemon.admin() as admin:
        admin.Deny(kerneld_pb2.DenyRequest(repo_id="kerneld-test/multi", reason="not here"))
    out = run_client(
        PRELUDE
        + f"""
from kerneld_client import KernelDenied, KernelNotFound, NoCompatibleVariant
res = {{}}
top = kerneld_client.get_kernel("{DEP_TOP}", version=1, policy="error")
res["deps"] = [(k.repo_id, k.source) for k in loaded_kernels()]
res["top"] = top.NAME
try:
    kerneld_client.get_kernel("{ACT}", version=2, policy="error")
except NoCompatibleVariant as exc:
    res["ncv"] = [[r.variant, r.accepted, r.reason] for r in exc.reasons]
try:
    kerneld_client.get_kernel("kerneld-test/absent", version=1, policy="error")
except KernelNotFound as exc:
    res["nf"] = str(exc)
try:
    kerneld_client.get_kernel("kerneld-test/multi", version=1, policy="error")
except KernelDenied as exc:
    res["denied"] = str(exc)
try:
    kerneld_client.get_kernel("{ACT}", version=9)
except ValueError as exc:  # kernels' type for it, and also KernelNotFound
    res["version"] = [str(exc), isinstance(exc, KernelNotFound)]
# A mapping naming that version can never be right: kernelize raises despite use_fallback.
import torch
from kerneld_client import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub
from kerneld_client import use_kernel_mapping

@use_kernel_forward_from_hub("Op")
class Op(torch.nn.Module):
    def forward(self, x):
        return x

with use_kernel_mapping({{"Op": {{"cpu": LayerRepository("{ACT}", layer_name="Op", version=9)}}}}):
    try:
        kernelize(torch.nn.Sequential(Op()), mode=Mode.INFERENCE, device="cpu")
    except ValueError as exc:
        res["kernelize"] = str(exc)
# A misspelt revision can never be right either: it raises as the wrong version does.
typo = LayerRepository("{ACT}", layer_name="Op", revision="mian")
with use_kernel_mapping({{"Op": {{"cpu": typo}}}}):
    try:
        kernelize(torch.nn.Sequential(Op()), mode=Mode.INFERENCE, device="cpu")
        res["typo"] = ["kept PyTorch"]
    except Exception as exc:
        res["typo"] = [type(exc).__name__, str(exc)]
# install_kernel names the store's variant folder by its real, absolute path (not the store
# root's relative name), so a caller can hand it to LOCAL_KERNELS or get_local_kernel.
installed = kerneld_client.install_kernel("{ACT}", version=1)
res["installed"] = [str(installed), installed.is_absolute(),
                    (installed / "metadata.json").is_file()]
res["variants"] = [[d.variant, d.accepted] for d in
                   kerneld_client.get_kernel_variants("{ACT}", version=1)]
res["has"] = [kerneld_client.has_kernel("{ACT}", version=1),
              kerneld_client.has_kernel("{ACT}", version=2)]
print(json.dumps(res))
""",
        env,
    )
    assert out["deps"] == [[DEP_BOTTOM, "daemon"], [DEP_TOP, "daemon"]]
    assert out["top"] == "_top_u"
    reasons = {v: (acc, why) for v, acc, why in out["ncv"]}
    assert set(reasons) == {
        "torch213-cxx11-cu128-x86_64-linux",
        "torch213-cxx11-cu130-x86_64-linux",
    }
    assert all(not acc and "CUDA" in why for acc, why in reasons.values())
    assert "kerneld-test/absent" in out["nf"]
    assert "not here" in out["denied"]
    message, also_not_found = out["version"]
    assert "Version 9 not found, available versions: 1, 2" in message and also_not_found
    assert message.count(f"{ACT}@v9") == 1, message  # said once, not by daemon and client both
    assert "Version 9 not found" in out["kernelize"]
    path, absolute, has_metadata = out["installed"]
    assert absolute and has_metadata and path.startswith(str(daemon.store_root)), out["installed"]
    assert out["typo"][0] == "RevisionNotFound" and f"{ACT}@mian" in out["typo"][1], out["typo"]
    assert out["variants"][0] == ["torch213-cxx11-cpu-x86_64-linux", True]
    assert out["has"] == [True, False]


def test_daemon_answer_checked_like_an_index_hit(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    """The daemon's answer names a tree of its store; this process loads that tree from its own
    store root (a container sees the store elsewhere), never from the daemon's absolute path: with
    KERNELD_STORE pointing at a directory that does not hold the store, the load fails, naming
    the root it looked in."""
    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    other = tmp_path / "other-store"
    other.mkdir()
    env = _env(daemon, tmp_path, KERNELD_STORE=str(other))
    out = run_client(
        PRELUDE
        + f"""
try:
    kerneld_client.get_kernel("{ACT}", version=1, policy="error")
    res = {{"loaded": True}}
except kerneld_client.KernelUnavailable as exc:
    res = {{"error": str(exc)}}
print(json.dumps(res))
""",
        env,
    )
    assert f"{other} (this process's store root) holds no v1/trees/" in out["error"], out


def test_lockfile_through_the_daemon(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    """get_locked_kernel lets the daemon fetch the locked commit; load_kernel never does."""
    from tests.fixtures_daemon import C1

    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    lock = tmp_path / "kernels.lock"
    lock.write_text(
        json.dumps([{"dependency": {"repo-id": ACT, "version": 1}, "lock": {"commit": C1}}])
    )
    env = _env(daemon, tmp_path)
    out = run_client(
        PRELUDE
        + f"""
res = {{}}
try:
    kerneld_client.load_kernel("{ACT}", lockfile="{lock}", policy="error")
except kerneld_client.KernelNotFound as exc:
    res["load"] = str(exc)
m = kerneld_client.get_locked_kernel("{ACT}", lockfile="{lock}", policy="error")
res["locked"] = m.NAME
res["again"] = kerneld_client.load_kernel("{ACT}", lockfile="{lock}", policy="error").NAME
res["src"] = [(k.commit, k.source) for k in loaded_kernels()]
print(json.dumps(res))
""",
        env,
    )
    assert "no local snapshot" in out["load"] and "may not download" in out["load"]
    assert out["locked"] == out["again"] == "_act_cpu213"
    assert out["src"] == [[C1, "daemon"]]
    assert json.loads(lock.read_text())[0]["lock"]["commit"] == C1
