"""Pytest plugin: on pytest-xdist workers, the longest files first, and no long file queued
behind another.

`make test` runs `--dist loadfile`: each test file goes whole to one worker (its module
fixtures, such as a module's daemon or Hub server, start once). The run then ends when its
longest chain of files on one worker ends, so two things decide the wall time:

- which file a free worker takes next. Longest-first (LPT) is the classic answer: the controller
  keeps each file's seconds from earlier runs on this machine (`record`, in the suite's cache
  outside the clone, tests/support/testcache.py) and hands out the longest known file first. On a
  machine with no record yet, every file with a test marked `slow` comes first (collection
  order, below), the rest in pytest's order.
- what xdist queues behind a file. A worker only starts a test once it holds the next one (its
  fixtures' teardown depends on it), so xdist gives a worker another file as soon as two or
  fewer of its tests are left: a file of one long test (a systemd boot, a container) always has
  another file queued behind it on the same worker, and with plain longest-first that is the
  next long one; the suite's systemd files once ran one after another on one worker for 640 s
  while the other two had finished (bench/SUITE.md). So a worker that has not begun its newest
  file yet, a long one (longer than the median file left), gets the shortest file left.

Serial runs keep pytest's order. All workers sort the same collection the same way, as xdist
requires (the record is read by the controller only).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

#: What a file's record holds: the seconds its tests took (setup, call and teardown summed).
RECORD = "file-seconds.json"
_seconds: dict[str, float] = {}


#: Test files whose containers share this machine's network namespace (tests/systemd/container.py)
#: and run the documented install, whose kerneld.socket binds the host's 127.0.0.1:848: two at
#: once on two workers collide ("Job failed" from `systemctl enable --now`, seen beside a CPU
#: hog when the longest-first order started two of them together). They are one work unit: one
#: worker runs them one after another. tests/test_scheduling.py checks the list is complete.
HOST_NETWORK_FILES = frozenset(
    f"tests/systemd/{name}.py"
    for name in ("test_airgap", "test_container_paths", "test_install", "test_store_ops")
)
HOST_NETWORK = "tests/systemd/[the host's network]"


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: its file, or HOST_NETWORK for the files listed there."""
    file = nodeid.split("::", 1)[0]
    return HOST_NETWORK if file in HOST_NETWORK_FILES else file


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {_file(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file(item) not in slow_files)  # stable: False (slow) first


def pick(queue: Sequence[str], seconds: Mapping[str, float], waiting: str | None = None) -> str:
    """The file to hand a worker next: the longest known (ties and unknown files in queue
    order); but where the worker has `waiting`, a file it has not started yet that is longer than
    the median file left, the shortest (the last of those), so that a long file never waits
    behind another long one."""
    left = sorted(seconds.get(f, 0.0) for f in queue)
    if waiting is not None and seconds.get(waiting, 0.0) > left[len(left) // 2]:
        return min(reversed(queue), key=lambda f: seconds.get(f, 0.0))
    return max(queue, key=lambda f: seconds.get(f, 0.0))


def record_path() -> Path:
    """This machine's record of the suite's seconds per file (outside the clone)."""
    from tests.support.testcache import cache_dir

    return cache_dir("suite-times") / RECORD


def load_record(path: Path) -> dict[str, float]:
    """The recorded seconds per file; empty where there is no record or it is unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}


def save_record(path: Path, seconds: Mapping[str, float]) -> None:
    """Merge `seconds` into the record (a file not run this time keeps its entry)."""
    merged = {**load_record(path), **seconds}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(merged, indent=0, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the controller (or a serial run): each file's seconds, from every phase's report."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    file = report.nodeid.split("::", 1)[0]
    _seconds[file] = _seconds.get(file, 0.0) + report.duration


def _part_of_files(config: pytest.Config) -> bool:
    """Whether the run chose some tests of a file (-k, -m, a test's id): their seconds are not
    the file's."""
    chosen = config.option.keyword or config.option.markexpr
    return bool(chosen) or any("::" in str(arg) for arg in config.args)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that passed updates the record of the files it ran whole (a failed or interrupted
    file's seconds, or some of its tests', say nothing of its length)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or exitstatus != 0 or not _seconds:
        return
    if _part_of_files(session.config):
        return
    with contextlib.suppress(OSError):  # a read-only cache: the next run orders as before
        save_record(record_path(), _seconds)


def _scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    seconds = load_record(record_path())
    seconds[HOST_NETWORK] = sum(seconds.get(f, 0.0) for f in HOST_NETWORK_FILES)

    class LongestFirst(LoadFileScheduling):  # type: ignore[misc]
        """xdist's loadfile scheduling with `pick` choosing the file it hands out, and the
        host-network files as one unit."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            files = self.assigned_work.get(node, {})
            newest = next(reversed(files), None)
            waiting = newest if newest and not any(files[newest].values()) else None
            chosen = pick(list(self.workqueue), seconds, waiting)
            self.workqueue.move_to_end(chosen, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` gets `LongestFirst`; the other modes stay xdist's."""
    if config.getvalue("dist") != "loadfile":
        return None
    return _scheduler(config, log)
