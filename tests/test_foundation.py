"""The foundation's promises: a light client import graph, stubs in sync, entry points that run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HEAVY = ("grpc", "google.protobuf", "huggingface_hub", "torch", "kerneld", "kernels")


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KERNELD_HOOK_KERNELS": "0", **(env or {})},
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "statement",
    [
        "import kerneld_client",
        "import kerneld_client.errors",
        "import kerneld_client.importer",
        "import kerneld_client.loader",
        "import kerneld_client.published_index",
        "import kerneld_client.file_locks",
        "import kerneld_client._path_trust",
        "import kerneld_client._config",
        "import kerneld_client._types",
        "import kerneld_client._rpc",
        "import kerneld_client._hub_download",
        "from kerneld_client import get_kernel, load_kernel, KernelError, loaded_kernels",
        "import kerneld_client.integrations",
        "import kerneld_client.integrations.kernels",
        "import kerneld_client.integrations._autohook",
        "import kerneld_client.integrations.diffusers",
    ],
)
def test_client_import_graph_is_light(statement: str) -> None:
    loaded = _modules_after(statement)
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"{statement!r} pulled in {heavy}"


def test_kernels_hook_at_start_is_light() -> None:
    """KERNELD_HOOK_KERNELS=1 runs the start-up hook (the .pth file) but imports neither
    `kernels` nor anything heavy until the program imports `kernels` itself."""
    loaded = _modules_after("pass", {"KERNELD_HOOK_KERNELS": "1"})
    assert "kerneld_client.integrations._autohook" in loaded  # the hook did run
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy


def test_import_graph_probe_can_fail() -> None:
    """The probe above really sees imports: importing grpc shows up."""
    assert "grpc" in _modules_after("import grpc")


def test_daemon_package_does_not_import_torch() -> None:
    loaded = _modules_after("import kerneld, kerneld.server.main, kerneld.ctl.main")
    assert not any(m == "torch" or m.startswith("torch.") for m in loaded)


def test_generated_stubs_match_proto() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "genproto"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_stub_check_detects_drift(tmp_path: Path) -> None:
    """Editing a committed stub makes the check fail (the check can fail)."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "protos", copy / "protos")
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(
        ROOT / "client" / "kerneld_client" / "proto", copy / "client" / "kerneld_client" / "proto"
    )
    stub = copy / "client" / "kerneld_client" / "proto" / "kerneld_pb2.py"
    stub.write_text(stub.read_text() + "\n# hand edit\n")
    result = subprocess.run(
        [sys.executable, str(copy / "scripts" / "genproto"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "kerneld_pb2.py" in result.stderr


def test_stubs_import_and_describe_both_services() -> None:
    from kerneld_client.proto import kerneld_pb2

    services = kerneld_pb2.DESCRIPTOR.services_by_name
    assert set(services) == {"Kernels", "Admin"}
    kernels_rpcs = {m.name for m in services["Kernels"].methods}
    assert {"Resolve", "ResolveMany", "GetStatus"} <= kernels_rpcs
    admin = services["Admin"].methods_by_name
    assert admin["Prefetch"].server_streaming
    assert admin["Verify"].server_streaming
    assert {
        "Pin",
        "Unpin",
        "Deny",
        "Allow",
        "GarbageCollect",
        "MirrorExport",
        "MirrorImport",
    } <= set(admin)


@pytest.mark.parametrize("script", ["kerneld", "kerneldctl"])
def test_console_scripts_report_version(script: str) -> None:
    exe = Path(sys.executable).parent / script
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{script} 0.1.0"
