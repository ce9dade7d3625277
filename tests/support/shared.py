"""A directory every pytest-xdist worker of one run shares, entered under a lock.

`make test` runs the suite on several workers (the Makefile's PYTEST_WORKERS), and each worker
runs its own session fixtures. Most are cheap, but some build minutes of files (venvs from the
package registry): built once per worker, they cost the run what the workers were meant to
save. A fixture that builds in `shared_dir(...)` builds once; a second worker waits on the lock
and finds the result (the builder must skip what it already finished).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock


def run_temp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's base temp directory: a worker's own is `<root>/popen-gwN`, the serial run's is
    the root itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """`<run root>/<name>`, held under `<name>.lock` until the block ends."""
    root = run_temp_root(tmp_path_factory)
    path = root / name
    with FileLock(str(root / f"{name}.lock")):
        path.mkdir(exist_ok=True)
        yield path
