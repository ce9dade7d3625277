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
from pathlib import Path
from typing import IO, Any

from tests.hubapi.venvs import make_venv

#: The release kerneld's legacy verdicts follow, and the newest (new names, SDKs, MLX).
RELEASES = ("0.17.2", "0.19.1")
CHILD = Path(__file__).with_name("kernels_resolver_child.py")


def make_clean_venv(root: Path, requirement: str) -> Path:
    """A venv at `root` with `requirement` and what pip resolves for it, nothing else (no
    torch: the resolver takes its facts as arguments); its python."""
    return make_venv(root.parent, [requirement], name=root.name, with_torch=False)


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
