"""How `make test` spreads the suite over pytest-xdist workers (tests/scheduling.py) and how a
fixture builds once for all of them (tests/support/shared.py), each checked in a small pytest run
of its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.scheduling import RECORD, load_record, pick
from tests.support.daemon import REPO_ROOT
from tests.support.testcache import CACHE_ENV

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


def _suite(tmp_path: Path, names: tuple[str, ...] = ("a_quick", "b_quick", "z_slow")) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in names:
        mark = "@pytest.mark.slow" if "slow" in name else ""
        (tmp_path / f"test_{name}.py").write_text(TEST_FILE.format(name=name, mark=mark))
    return tmp_path


def _record(suite: Path, seconds: dict[str, float]) -> Path:
    path = suite / "cache" / "suite-times" / RECORD
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(seconds))
    return path


def _pytest(suite: Path, *args: str) -> None:
    # the record of file seconds in the toy suite's own cache, not this machine's
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), CACHE_ENV: str(suite / "cache")}
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run on a worker
    env.pop("PYTEST_ADDOPTS", None)
    # the one plugin the toy suite needs, not every installed one (half of each run's start-up)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist.plugin"]
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


def test_one_worker_runs_the_longest_recorded_file_first_and_records_the_run(
    tmp_path: Path,
) -> None:
    suite = _suite(tmp_path)
    record = _record(suite, {"test_b_quick.py": 50.0, "test_a_quick.py": 5.0, "gone.py": 9.0})
    _pytest(suite, "-n", "1", "--dist", "loadfile")
    # b_quick, the longest; then behind it (its one test not begun) the shortest, z_slow (none)
    assert (suite / "order.log").read_text().split() == ["b_quick", "z_slow", "a_quick"]
    seconds = load_record(record)
    assert set(seconds) == {"test_a_quick.py", "test_b_quick.py", "test_z_slow.py", "gone.py"}
    assert seconds["test_b_quick.py"] < 50.0 and seconds["gone.py"] == 9.0  # this run's, merged


def test_a_long_file_is_not_queued_behind_another_long_one(tmp_path: Path) -> None:
    """xdist queues a file behind a one-test file before that test starts: behind the longest
    file the shortest, not the next longest."""
    suite = _suite(tmp_path, ("long_a", "long_b", "mid", "short"))
    times = {"test_long_a.py": 100.0, "test_long_b.py": 90.0, "test_mid.py": 10.0}
    _record(suite, {**times, "test_short.py": 1.0})
    _pytest(suite, "-n", "1", "--dist", "loadfile")
    assert (suite / "order.log").read_text().split() == ["long_a", "short", "long_b", "mid"]


def test_pick_longest_first_and_the_shortest_behind_a_long_start() -> None:
    seconds = {"a": 10.0, "b": 300.0, "c": 2.0, "d": 120.0}
    assert pick(["a", "b", "c", "d"], seconds) == "b"
    assert pick(["a", "c", "d"], seconds, waiting="b") == "c"  # b is long: no d behind it
    assert pick(["a", "b", "d"], seconds, waiting="c") == "b"  # c is short: the longest
    assert pick(["a", "x", "d"], seconds, waiting="b") == "x"  # unknown counts as shortest
    assert pick(["a", "x", "y"], {}, waiting="z") == "a"  # nothing recorded: queue order


def test_a_run_of_some_tests_of_a_file_leaves_the_record_alone(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    record = _record(suite, {"test_a_quick.py": 5.0})
    _pytest(suite, "-k", "a_quick")
    _pytest(suite, "test_a_quick.py::test_a_quick")
    assert load_record(record) == {"test_a_quick.py": 5.0}
    _pytest(suite, "test_a_quick.py")
    assert load_record(record)["test_a_quick.py"] < 5.0


def test_the_host_network_files_are_one_work_unit() -> None:
    from tests.scheduling import HOST_NETWORK, scope_of

    assert scope_of("tests/systemd/test_install.py::test_x") == HOST_NETWORK
    assert scope_of("tests/systemd/test_store_ops.py::test_y[1]") == HOST_NETWORK
    assert scope_of("tests/systemd/test_reload.py::test_z") == "tests/systemd/test_reload.py"


def test_every_file_with_a_container_on_the_host_network_is_listed() -> None:
    """A test file that boots a Container without `private_network=True` (or takes
    test_install's `container` fixture) runs the documented install on this machine's network:
    it must be in HOST_NETWORK_FILES, or it can start beside another and collide on port 848."""
    from tests.scheduling import HOST_NETWORK_FILES

    tests = Path(__file__).resolve().parent
    shared = set()
    for path in sorted(tests.rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        calls = re.findall(r"Container\((?:[^()]|\([^()]*\))*\)", text)
        imports = re.findall(
            r"from tests\.systemd\.test_install import \(?([^)\n]*(?:\n[^)]*)?)", text
        )
        if any("private_network=True" not in call for call in calls) or any(
            re.search(r"\bcontainer\b", names) for names in imports
        ):
            shared.add(path.relative_to(tests.parent).as_posix())
    assert shared, "the scan found no container test: it is broken"
    assert shared == set(HOST_NETWORK_FILES)
