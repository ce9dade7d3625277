"""Builds as `kernels` 0.19 publishes them, through the real daemon: a variant under the new
name format and a zip build (`build-layout: zip`), fetched by the daemon, loaded cold over the
RPC and warm from the published index, with the same trust and digest checks as a folder build
(`KERNELD_VERIFY=1` re-hashes the archive; a changed archive is refused before it runs)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from examples.kernels.specs import ORG
from tests.client.support import OPS_CHECK, client_env, run_client
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

NEXT = f"{ORG}/relu2-next"

LOAD = (
    "import json, os, sys\n"
    + OPS_CHECK
    + f"""
import kerneld_client
from kerneld_client import loaded_kernels

out = {{}}
for version in (1, 2):
    try:
        mod = kerneld_client.get_kernel("{NEXT}", version=version, policy="error")
    except Exception as exc:
        out[version] = {{"error": type(exc).__name__, "message": str(exc)}}
        continue
    x = torch.randn(8, 8)
    ok = torch.equal(mod.relu2(torch.empty_like(x), x), torch.relu(x) ** 2)
    if version == 2:
        y = torch.randn(4, 6)
        d = y.shape[-1] // 2
        got = mod.relu2_and_mul_alloc(y)
        ok = ok and torch.allclose(got, torch.relu(y[:, :d]) ** 2 * y[:, d:])
    info = [k for k in loaded_kernels() if k.module is mod][0]
    out[version] = {{"ok": ok, "file": mod.__file__, "variant": info.variant,
                    "source": info.source, "path": str(info.path)}}
out["grpc"] = "grpc" in sys.modules
print(json.dumps(out))
"""
)


@pytest.fixture
def hub_daemon(
    make_daemon: Callable[..., DaemonProcess], example_server: HubServer
) -> DaemonProcess:
    example_server.reset()
    return make_daemon(hub_endpoint=example_server.url)


def _env(daemon: DaemonProcess, tmp_path: Path, **extra: str) -> dict[str, str]:
    return client_env(None, tmp_path, KERNELD_SOCKET=str(daemon.user_socket), **extra)


def test_new_name_and_zip_builds_cold_through_the_daemon_then_warm(
    hub_daemon: DaemonProcess,
    example_server: HubServer,
    built_examples: BuiltExamples,
    tmp_path: Path,
) -> None:
    env = _env(hub_daemon, tmp_path)
    cold = run_client(LOAD, env)
    v1, v2 = built_examples.variant("relu2-next", 1), built_examples.variant("relu2-next", 2)
    assert v2.layout == "zip" and v1.variant == v2.variant  # the new-format name
    for version, built in ((1, v1), (2, v2)):
        got = cold[str(version)]
        assert got.get("ok") is True, got
        assert got["variant"] == built.variant and got["source"] == "daemon"
        assert Path(got["path"]).is_relative_to(hub_daemon.store_root.resolve())
    # The zip build runs from its archive in the store, the library from beside it.
    assert cold["2"]["file"] == str(Path(cold["2"]["path"]) / f"{v2.module_id}.zip/__init__.py")
    assert cold["1"]["file"] == str(Path(cold["1"]["path"]) / "__init__.py")
    fetched = {r.path for r in example_server.requests if r.kind == "resolve_get"}
    assert any(p.endswith(f"{v2.module_id}.zip") for p in fetched), fetched

    example_server.reset_counts()
    warm = run_client(LOAD, _env(hub_daemon, tmp_path, KERNELD_VERIFY="1"))
    for version in ("1", "2"):
        assert warm[version]["ok"] is True and warm[version]["source"] == "index", warm
        assert warm[version]["path"] == cold[version]["path"]
    assert warm["grpc"] is False and example_server.total() == 0


def test_a_changed_archive_is_refused_before_it_runs(
    hub_daemon: DaemonProcess, built_examples: BuiltExamples, tmp_path: Path
) -> None:
    """The archive is one of the tree's files: KERNELD_VERIFY re-hashes it against the digest,
    and a zip build whose archive changed in the store is CorruptTree, not imported."""
    env = _env(hub_daemon, tmp_path)
    cold = run_client(LOAD, env)
    tree = Path(cold["2"]["path"])
    archive = tree / f"{built_examples.variant('relu2-next', 2).module_id}.zip"
    mode = archive.stat().st_mode
    os.chmod(tree, stat.S_IMODE(tree.stat().st_mode) | stat.S_IWUSR)
    os.chmod(archive, stat.S_IMODE(mode) | stat.S_IWUSR)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    os.chmod(archive, stat.S_IMODE(mode))
    os.chmod(tree, stat.S_IMODE(tree.stat().st_mode) & ~stat.S_IWUSR)
    out = run_client(LOAD, _env(hub_daemon, tmp_path, KERNELD_VERIFY="1"))
    assert out["1"].get("ok") is True  # the files build is untouched
    assert out["2"]["error"] == "CorruptTree", out["2"]
    assert archive.name in out["2"]["message"], out["2"]
