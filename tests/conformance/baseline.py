"""A release's plain baseline, run once per content and reused by later runs (issue 55).

The baseline is `kernels` alone, in its clean venv, against the stand-in Hub: nothing of
kerneld's takes part (harness.py), so its outcomes change only with what it is made of: the
release and its suite, its venv, the stand-in repos and the Hub test server that serves them.
It was a third of each conformance test's time (0.19.1: 61 of 156 s beside a CPU hog), spent
every run to learn the same answer. Its outcomes are kept in the test cache
(tests/support/testcache.py) under a key of those inputs; any change to one of them (a source
file of the stand-ins, the Hub server or the harness, a venv of other pins) is another key and a
fresh run. Only a baseline that the harness accepts is kept (at least the release's minimum of
passing tests), so a broken run is never reused. KERNELD_TEST_FRESH_BASELINE=1 runs it anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.support.testcache import cache_dir, content_key, locked

FRESH_ENV = "KERNELD_TEST_FRESH_BASELINE"
_TESTS = Path(__file__).resolve().parents[1]
#: Folders whose sources make the baseline's world: the stand-ins, the suite's fetch and run,
#: the harness's environment, and the Hub test server (with the helpers it imports).
_SOURCES = (_TESTS / "conformance", _TESTS / "support", _TESTS / "client" / "support.py")


def sources_digest() -> str:
    """A hash of every non-test source file the baseline's outcome depends on."""
    digest = hashlib.sha256()
    for folder in _SOURCES:
        files = [folder] if folder.is_file() else sorted(folder.rglob("*.py"))
        for path in files:
            if path.name.startswith("test_"):
                continue
            digest.update(str(path.relative_to(_TESTS)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def baseline_path(version: str, python: Path, suite: Path) -> Path:
    """Where the outcomes of `version`'s plain run with `python` on `suite` are kept."""
    # Not realpath: a venv's python links to the base interpreter; its folder names the venv's key.
    key = content_key(version, os.path.abspath(python), os.path.abspath(suite), sources_digest())
    return cache_dir("conformance-baselines") / f"kernels-{version}-{key}.json"


def cached_baseline(
    path: Path, run: Callable[[], dict[str, str]], accept: Callable[[Mapping[str, str]], bool]
) -> tuple[dict[str, str], bool]:
    """(outcomes, whether they came from the cache): the kept outcomes at `path`, else `run()`'s,
    kept when `accept` says the run is sound. One run at a time per key (another worker or
    clone making it waits, then reads it)."""
    fresh = os.environ.get(FRESH_ENV, "").strip() not in ("", "0")
    with locked(path):
        if not fresh:
            try:
                outcomes = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                outcomes = None
            if isinstance(outcomes, dict) and accept(outcomes):
                return {str(k): str(v) for k, v in outcomes.items()}, True
        outcomes = run()
        if accept(outcomes):
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(outcomes, indent=0, sort_keys=True), encoding="utf-8")
            tmp.replace(path)
        return outcomes, False
