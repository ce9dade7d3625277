"""`make bench` rewrites bench/RESULTS.md but keeps the sections measured by other commands."""

from __future__ import annotations

from pathlib import Path

from bench.results_file import KEPT_MARKER, kept_sections

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "RESULTS.md"


def test_the_kept_part_is_the_marker_and_what_follows(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    assert kept_sections(results) == ""  # no file yet
    results.write_text("# generated\n\n## 1. Warm load\n", encoding="utf-8")
    assert kept_sections(results) == ""  # nothing to keep
    hand = f"{KEPT_MARKER}\n\n## The test suite\n\n| a | b |\n"
    results.write_text(f"# generated\n\n## 1. Warm load\n\n{hand}", encoding="utf-8")
    assert kept_sections(results) == "\n" + hand


def test_the_committed_results_keep_their_measured_sections() -> None:
    """The hand-measured sections sit after the marker, so a rewrite does not drop them."""
    text = RESULTS.read_text(encoding="utf-8")
    generated, _, kept = text.partition(KEPT_MARKER)
    assert kept, "bench/RESULTS.md lost its marker: make bench would drop the measured sections"
    for title in ("## The test suite", "## `kernels`' own suites through kerneld"):
        assert title in kept and title not in generated
