"""Shared plumbing of the atheris targets: paths, instrumentation, seed corpora, the run loop.

The invariants themselves live in `tests/fuzz/invariants.py` and the harnesses that apply them to
real components in `tests/fuzz/harnesses.py` (both shared with the hypothesis tests): a target
only turns libFuzzer's bytes into those modules' inputs.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "client") not in sys.path:
    sys.path.insert(1, str(ROOT / "client"))

import atheris  # noqa: E402

#: What coverage feedback is collected for: our code only (not the stdlib, not grpc).
INSTRUMENTED = ["kerneld", "kerneld_client"]

Target = Callable[[bytes], None]


def workdir(name: str) -> Path:
    """A scratch directory for harnesses that need a store or files. libFuzzer ends the process
    without running Python's exit handlers, so after a fuzzing run it stays behind (useful after
    a crash); it is removed only when the seeds-only smoke test exits normally."""
    path = Path(tempfile.mkdtemp(prefix=f"kerneld-fuzz-{name}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _seed(corpus_dirs: list[str], seeds: Mapping[str, bytes]) -> None:
    """Write the seeds into the first corpus directory when it is missing or empty."""
    if not corpus_dirs:
        return
    first = Path(corpus_dirs[0])
    first.mkdir(parents=True, exist_ok=True)
    if any(first.iterdir()):
        return
    for name, data in seeds.items():
        (first / f"seed-{name}").write_bytes(data)


def run(
    name: str, modules: list[str], make: Callable[[], tuple[Target, Mapping[str, bytes]]]
) -> None:
    """Instrument `modules`, build the target and its seeds, seed the corpus, fuzz."""
    # Refusals are logged as warnings by the daemon's code: millions of them are only noise.
    logging.disable(logging.CRITICAL)
    with atheris.instrument_imports(include=INSTRUMENTED):
        for module in modules:
            __import__(module)
    target, seeds = make()
    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    _seed(corpus, seeds)
    if os.environ.get("KERNELD_FUZZ_SEEDS_ONLY"):
        for data in seeds.values():
            target(data)
        print(f"{name}: {len(seeds)} seeds pass")  # noqa: T201
        return
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
