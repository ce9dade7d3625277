"""Pytest plugin: on pytest-xdist workers, the files with slow tests are handed out first.

`make test` runs `--dist loadfile`: each test file goes whole to one worker (its module
fixtures, such as a module's daemon or Hub server, start once), in collection order. The run
then ends when its longest file ends, so a minute-long file collected last keeps one worker busy
long after the others have finished. Longest-first is the classic fix for that: every file with
a test marked `slow` moves to the front (their order among themselves, and everyone else's,
unchanged), and the short files fill the gaps behind them.

Serial runs keep pytest's own order. All workers sort the same collection the same way, as xdist
requires.
"""

from __future__ import annotations

import os

import pytest


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {_file(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file(item) not in slow_files)  # stable: False (slow) first
