"""RESULTS.md is written by `bench.run` and by hand: the part after `KEPT_MARKER` holds figures
that other commands measure (the test suite, the conformance suites, the image build, ...), each
with its command, and a `make bench` run keeps it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["KEPT_MARKER", "kept_sections"]

#: The line in RESULTS.md after which sections measured by their own commands (the test suite,
#: the conformance suites, the image build, ...) are kept when a run rewrites the file.
KEPT_MARKER = (
    "<!-- bench.run writes everything above this line; the sections below are measured by their "
    "own commands (each names its command) and bench.run keeps them as they are. -->"
)


def kept_sections(path: Path) -> str:
    """The marker and what follows it in the results file being replaced ("" if none), so a
    run does not drop the figures that other commands measured."""
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    at = old.find(KEPT_MARKER)
    return "" if at < 0 else "\n" + old[at:]
