"""How `make test` spreads the suite over pytest-xdist workers (tests/scheduling.py) and how a
fixture builds once for all of them (tests/support/shared.py), each checked in a small pytest run
of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import REPO_ROOT

CONFTEST = """
import time
from pathlib import Path

import pytest

from tests.support.shared import shared_dir

pytest_plugins = ["tests.scheduling"]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: slow")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    with shared_dir(tmp_path_factory, "thing") as root:
        done = root / "done"
        if not done.exists():
            with open(Path(__file__).with_name("builds.log"), "a") as log:
                log.write("built\\n")
            time.sleep(0.5)  # the other worker asks meanwhile
            done.write_text("yes")
        return done.read_text()
"""

TEST_FILE = """
import pytest
{mark}
def test_{name}(built):
    assert built == "yes"
    with open("order.log", "a") as log:
        log.write("{name}\\n")
"""


def _suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, slow in (("a_quick", False), ("b_quick", False), ("z_slow", True)):
        mark = "@pytest.mark.slow" if slow else ""
        (tmp_path / f"test_{name}.py").write_text(TEST_FILE.format(name=name, mark=mark))
    return tmp_path


def _pytest(suite: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run on a worker
    env.pop("PYTEST_ADDOPTS", None)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*argv, "--rootdir", str(suite), *args],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_one_worker_runs_the_files_with_slow_tests_first(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    _pytest(suite, "-n", "1", "--dist", "loadfile", "--no-loadscope-reorder")
    assert (suite / "order.log").read_text().split() == ["z_slow", "a_quick", "b_quick"]


def test_a_serial_run_keeps_pytests_order(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    _pytest(suite)
    assert (suite / "order.log").read_text().split() == ["a_quick", "b_quick", "z_slow"]


def test_a_shared_fixture_builds_once_for_all_workers(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    _pytest(suite, "-n", "3", "--dist", "loadfile")
    assert sorted((suite / "order.log").read_text().split()) == ["a_quick", "b_quick", "z_slow"]
    assert (suite / "builds.log").read_text().split() == ["built"]
