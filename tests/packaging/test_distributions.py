"""Two distributions from this repository: `kerneld-client` (client/, what a training image
installs: the standard library plus grpcio and protobuf) and `kerneld` (the daemon and
kerneldctl, depending on it). Both wheels are built from a copy of the sources; the client's is
installed alone into a fresh venv of the distribution's python that has torch already (as a
training image has), which then loads a kernel through a real daemon and warm from its published
index.

Needs the package index (or pip's cache) for the build backend, grpcio and protobuf, as `make
test`'s set-up does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures_daemon import ACT
from tests.hubapi.venvs import add_torch_layer, torch_only, venv_root
from tests.security.support import CPU_FACTS
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BASE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
TORCH = "torch==2.13.0"
#: What the daemon needs and a training image must not get.
DAEMON_ONLY = {
    "kerneld",
    "huggingface-hub",
    "cryptography",
    "rich",
    "prometheus-client",
    "sdnotify",
    "grpcio-health-checking",
    "grpcio-reflection",
}
_IGNORE = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc")


def _run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return str(done.stdout)


def _wheels(tmp: Path) -> tuple[Path, Path]:
    """(kerneld-client wheel, kerneld wheel), built from copies of the sources."""
    src = tmp / "src"
    shutil.copytree(ROOT / "client", src / "client", ignore=_IGNORE)
    (src / "root").mkdir()
    shutil.copytree(ROOT / "kerneld", src / "root" / "kerneld", ignore=_IGNORE)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / "root" / name)
    out = tmp / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", "--quiet", "--no-deps", "-w", str(out), str(src / "client")])
    _run([*pip, "wheel", "--quiet", "--no-deps", "-w", str(out), str(src / "root")])
    (client,) = out.glob("kerneld_client-*.whl")
    (daemon,) = out.glob("kerneld-*.whl")
    return client, daemon


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return z.read(meta).decode()


@pytest.mark.timeout(600)  # two wheel builds and an install: minutes on a busy machine
def test_the_client_installs_alone_and_loads_kernels(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    client, daemon_wheel = _wheels(tmp_path)
    # The split: each wheel holds its own package, and kerneld depends on the client.
    assert not any(n.startswith("kerneld/") for n in _names(client))
    assert "kerneld_client_hook.pth" in _names(client)
    assert not any(n.startswith("kerneld_client/") for n in _names(daemon_wheel))
    assert "Requires-Dist: kerneld-client==0.1.0" in _metadata(daemon_wheel)
    assert "Requires-Dist: huggingface_hub" in _metadata(client)  # only as the [hub] extra
    assert 'extra == "hub"' in next(
        line for line in _metadata(client).splitlines() if "huggingface_hub" in line
    )

    venv = tmp_path / "image"
    _run([BASE_PYTHON, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    # A training image has torch before kerneld-client comes: here the suite's torch layer (the
    # project venv's torch, compiled; tests/hubapi/venvs.py) on the venv's path. pip sees it as
    # installed, so the install below adds the client's own closure, the thing tested; pip
    # installing and compiling torch again took two thirds of this test's 34 s of CPU.
    add_torch_layer(Path(py), torch_only(venv_root()))
    _run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", TORCH, str(client)])
    installed = {
        p["name"].lower().replace("_", "-")
        for p in json.loads(_run([py, "-m", "pip", "list", "--format", "json"]))
    }
    assert {"kerneld-client", "grpcio", "protobuf", "torch"} <= installed
    assert not installed & DAEMON_ONLY, installed & DAEMON_ONLY

    d = make_daemon(mirror_dirs=[kernel_mirror])
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "KERNELD_STORE": str(d.store_root),
        "KERNELD_SOCKET": str(d.user_socket),
        "KERNELD_PLATFORM_JSON": CPU_FACTS,
    }
    job = (
        "import json, sys, kerneld_client\n"
        f"mod = kerneld_client.get_kernel({ACT!r}, version=1, policy='error')\n"
        "src = kerneld_client.loaded_kernels()[-1].source\n"
        "print(json.dumps({'source': src, 'client': kerneld_client.__file__,"
        " 'kerneld': 'kerneld' in sys.modules}))\n"
    )
    for expected in ("daemon", "index"):
        out = json.loads(_run([py, "-c", job], env=env, cwd=str(tmp_path)).splitlines()[-1])
        assert out["source"] == expected, out
        assert out["client"].startswith(str(venv)) and not out["kerneld"], out
