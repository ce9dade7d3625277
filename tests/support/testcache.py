"""Where the suite's heavy set-up lives: a cache outside the clone, keyed by content (issue 55).

Release venvs, the conformance suites, the example builds, the systemd test's wheelhouse and
the container image take minutes to make. `make test-deps` (tests/deps.py) makes them before
the suite, outside any test's timeout, into one folder every clone on the machine shares; a
fixture that finds its entry there uses it, and one that does not makes it itself (a single
file run by hand). Every entry's name carries a hash of what it was made from (the pinned
versions, the interpreter, the sources), so a change makes a new entry and never reuses a stale
one.

The folder: $KERNELD_TEST_CACHE, else /var/cache/kerneld-test for root (the suite's daemons and
jobs run as other users, who can read it but not root's home), else
$XDG_CACHE_HOME/kerneld-test (~/.cache by default).

Two clones may fill it at once: `entry()` holds a lock per entry while one makes it, and an
entry is whole once its `.complete` marker (or its own marker) exists, written last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

CACHE_ENV = "KERNELD_TEST_CACHE"
SYSTEM_CACHE = Path("/var/cache/kerneld-test")


def cache_root() -> Path:
    """The cache folder (created; readable by everyone, as the suite's other users read it)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        root = Path(configured)
    elif os.geteuid() == 0:
        root = SYSTEM_CACHE
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(xdg) / "kerneld-test"
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    return root


def cache_dir(kind: str) -> Path:
    """`<cache>/<kind>` (venvs, examples, image, ...), created."""
    path = cache_root() / kind
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path


def content_key(*parts: object) -> str:
    """16 hex digits of a hash of `parts` (JSON): the pinned versions, paths and facts an
    entry is made from."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def interpreter_key() -> str:
    """The interpreter venvs are made from: a venv of another Python is another entry."""
    return content_key(sys.version, os.path.realpath(sys.executable), sys.base_prefix)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold `<path>.lock` (another clone making the same entry waits here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.parent / f"{path.name}.lock")):
        yield


@contextmanager
def staging(dest: Path) -> Iterator[Path]:
    """A fresh folder beside `dest` to make an entry in; renamed to `dest` (atomic: one file
    system) when the block ends without an error, removed otherwise. Call under `locked`."""
    tmp = dest.parent / f".staging-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        shutil.rmtree(dest, ignore_errors=True)  # an incomplete entry of a killed run
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def link_tree(source: Path, dest: Path) -> None:
    """`source` copied to `dest` as hard links where the file system allows (the cache and the
    project's venv usually share one), else as copies; symlinks stay symlinks."""

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, dest, symlinks=True, copy_function=link_or_copy)
    else:
        link_or_copy(str(source), str(dest))
