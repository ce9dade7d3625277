"""Throw-away virtual environments with one released `kernels` each, from the package registry.

Unmodified `kernels` of several releases must load kernels through the daemon's Hub API. Each
gets its own venv with only what pip resolves for `kernels==X` (so its own huggingface_hub);
torch, which the registry would bring as a multi-GB CUDA build, comes from the project's venv
through a `.pth` line, appended after the venv's own site-packages so that nothing else of the
project's (its `kernels`, its huggingface_hub, kerneld's start-up hook) shadows the venv's.
A `.pth` line only adds a folder: the `.pth` files inside it (kerneld's hook) are not run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: The newest 0.14 and 0.16 releases and the one the hook patches (issue 24).
KERNELS_RELEASES = ("0.14.1", "0.16.2", "0.17.2")
INSTALL_TIMEOUT_S = 600


def _project_site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def make_venv(root: Path, release: str) -> Path:
    """A venv at `root` with `kernels==release`; its python."""
    python = root / "bin" / "python"
    if not python.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", str(root)], check=True, timeout=120, capture_output=True
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_TARGET", "PYTHON"))}
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"kernels=={release}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"pip install kernels=={release} failed (the package registry must be reachable):\n"
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
    return python


def make_venvs(root: Path, releases: tuple[str, ...] = KERNELS_RELEASES) -> dict[str, Path]:
    """One venv per release, built side by side; release -> python."""
    with ThreadPoolExecutor(max_workers=len(releases)) as pool:
        futures = {r: pool.submit(make_venv, root / f"kernels-{r}", r) for r in releases}
        return {r: f.result() for r, f in futures.items()}
