"""Released `kernels` resolvers, each in its own clean venv, for the drift tests.

Each venv holds only what pip resolves for `kernels==X`: no `.pth` line to the project's
site-packages, no torch (the resolver takes its facts as arguments), run with `python -I` from a
scratch directory, so neither the project's packages nor its `kernels` can answer in its place.
The child (`kernels_resolver_child.py`) stays up for the session and answers one JSON line per
request, so a hypothesis test can ask it hundreds of times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

#: The release kerneld's legacy verdicts follow, and the newest (new names, SDKs, MLX).
RELEASES = ("0.17.2", "0.19.1")
CHILD = Path(__file__).with_name("kernels_resolver_child.py")
INSTALL_TIMEOUT_S = 600


def make_clean_venv(root: Path, requirement: str) -> Path:
    """A venv at `root` with `requirement` and what pip resolves for it, nothing else; its
    python. Reused when a previous call finished it (`.installed`)."""
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
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    proc = subprocess.run(
        [*pip, "install", "--quiet", requirement],
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
    done.write_text(requirement + "\n")
    return python


class ReleaseResolver:
    """One release's resolver in a child process; `judge(names, facts)` is its verdict."""

    def __init__(self, python: Path, scratch: Path) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch)}
        self._proc = subprocess.Popen(
            [str(python), "-I", str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=scratch,
            env=env,
        )
        hello = self._read()
        self.release: str = hello["ready"]
        self.isolation: dict[str, Any] = hello["isolation"]

    def _read(self) -> dict[str, Any]:
        out: IO[str] | None = self._proc.stdout
        assert out is not None
        line = out.readline()
        if not line:
            err = self._proc.stderr.read() if self._proc.stderr else ""
            raise RuntimeError(f"the kernels resolver child exited: {err}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def judge(self, names: list[str], facts: dict[str, Any]) -> dict[str, Any]:
        stdin = self._proc.stdin
        assert stdin is not None
        stdin.write(json.dumps({"names": names, "facts": facts}) + "\n")
        stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
