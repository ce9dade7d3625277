"""`make run`'s main job runs end to end and says OK (it also checks its own results)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_main_job_runs(built_examples) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "examples.main_job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1].endswith("OK")
    assert any("tree unchanged by the import: True" in line for line in lines)
    assert any(line.startswith("7. store verify: clean") for line in lines)
