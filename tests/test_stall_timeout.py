"""A test's timeout means hung, not slow (tests/stall_timeout.py, issue 55): each case is a small
test module run by its own pytest with a 1 s timeout, with and without the plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import REPO_ROOT

CASES = """
import subprocess, sys, time

import pytest


def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.mark.timeout(1)
def test_sleeps():
    time.sleep(60)


@pytest.mark.timeout(1)
def test_works_for_3s_of_cpu():
    burn(3)


@pytest.mark.timeout(1)
def test_waits_on_a_child_that_works():
    code = "import time\\nend = time.process_time() + 3\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.timeout(0.5)
def test_spins_forever():
    while True:
        pass
"""


def run_cases(tmp_path: Path, case: str, *, plugin: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_cases.py").write_text(CASES)
    args = ["-p", "tests.stall_timeout"] if plugin else []
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "pytest_timeout",
            *args,
            f"test_cases.py::{case}",
        ],
        cwd=tmp_path,
        # pytest-timeout, not every installed plugin (half of each run's start-up)
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("case", ["test_works_for_3s_of_cpu", "test_waits_on_a_child_that_works"])
def test_a_slow_test_that_keeps_working_passes(tmp_path: Path, case: str) -> None:
    out = run_cases(tmp_path, case, plugin=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # pytest-timeout alone fails the same test: wall clock, whatever the test was doing
    plain = run_cases(tmp_path, case, plugin=False)
    assert plain.returncode == 1 and "Timeout (>1.0s) from pytest-timeout" in plain.stdout


def test_a_test_that_waits_on_nothing_fails_as_hung(tmp_path: Path) -> None:
    out = run_cases(tmp_path, "test_sleeps", plugin=True)
    assert out.returncode == 1, out.stdout
    assert "Failed: Timeout: hung: the test's processes used" in out.stdout, out.stdout
    assert "time.sleep(60)" in out.stdout  # where it hung


def test_a_test_that_spins_forever_meets_the_backstop(tmp_path: Path) -> None:
    out = run_cases(tmp_path, "test_spins_forever", plugin=True)
    assert out.returncode == 1, out.stdout
    assert "Failed: Timeout: still running after" in out.stdout, out.stdout
