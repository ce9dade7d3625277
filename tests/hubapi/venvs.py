"""Throw-away virtual environments with one released `kernels` each, from the package registry.

Unmodified `kernels` of several releases must load kernels through the daemon's Hub API. Each
gets its own venv with only what pip resolves for `kernels==X` (so its own huggingface_hub);
torch, which the registry would bring as a multi-GB CUDA build, comes from the project's venv
through a `.pth` line, appended after the venv's own site-packages so that nothing else of the
project's (its `kernels`, its huggingface_hub, kerneld's start-up hook) shadows the venv's.
A `.pth` line only adds a folder: the `.pth` files inside it (kerneld's hook) are not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: The newest 0.14 and 0.16 releases, the one the hook patches, and the newest (issue 24).
KERNELS_RELEASES = ("0.14.1", "0.16.2", "0.17.2", "0.19.1")
#: The newest Transformers: it requires kernels>=0.19.1,<0.20, which the hook does not know.
TRANSFORMERS_RELEASE = "5.25.0"
INSTALL_TIMEOUT_S = 600


def _project_site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def make_venv(root: Path, requirement: str) -> Path:
    """A venv at `root` with `requirement` (`kernels==0.16.2`) and what pip resolves for it;
    its python. A venv a previous call finished (`.installed`) is reused as it is.

    The venv has no pip of its own: the project's pip installs into it (`pip --python`), which
    saves the seconds `ensurepip` spends copying pip into every venv."""
    python = root / "bin" / "python"
    done = root / ".installed"
    if done.exists():
        return python
    if not python.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(root)],
            check=True,
            timeout=120,
            capture_output=True,
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_TARGET", "PYTHON"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"pip install {requirement} failed (the package registry must be reachable):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(purelib, "zz-project-torch.pth").write_text(_project_site_packages() + "\n")
    done.write_text(requirement + "\n")
    return python


def make_venvs(root: Path, requirements: list[str]) -> dict[str, Path]:
    """One venv per requirement, built side by side; requirement -> python."""
    with ThreadPoolExecutor(max_workers=len(requirements)) as pool:
        futures = {r: pool.submit(make_venv, root / r.replace("==", "-"), r) for r in requirements}
        return {r: f.result() for r, f in futures.items()}


def run_in_venv(
    python: Path, script: Path, args: dict[str, Any], env: dict[str, str], timeout: float = 300
) -> dict[str, Any]:
    """Run a child script by path in a venv's python, from `env["HOME"]`; the JSON object its
    last stdout line holds."""
    proc = subprocess.run(
        [str(python), str(script), json.dumps(args)],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out
