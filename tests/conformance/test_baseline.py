"""The conformance baseline's cache (baseline.py): kept only when sound, reused only for the same
inputs, and never when asked for a fresh run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance import baseline
from tests.support.testcache import CACHE_ENV

SOUND = {"tests/test_a.py::ok": "passed", "tests/test_a.py::gpu": "failed"}


def _accept(outcomes: object) -> bool:
    return isinstance(outcomes, dict) and "passed" in outcomes.values()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(baseline.FRESH_ENV, raising=False)
    return tmp_path / "cache"


def test_a_sound_baseline_is_kept_and_reused(cache: Path, tmp_path: Path) -> None:
    runs: list[int] = []
    path = baseline.baseline_path("0.19.1", tmp_path / "python", tmp_path / "suite")

    def run() -> dict[str, str]:
        runs.append(1)
        return dict(SOUND)

    assert baseline.cached_baseline(path, run, _accept) == (SOUND, False)
    assert baseline.cached_baseline(path, run, _accept) == (SOUND, True)
    assert len(runs) == 1 and path.is_relative_to(cache)


def test_an_unsound_or_unreadable_baseline_is_run_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = baseline.baseline_path("0.17.2", tmp_path / "python", tmp_path / "suite")
    broken = {"tests/test_a.py::ok": "error"}
    assert baseline.cached_baseline(path, lambda: broken, _accept) == (broken, False)
    assert not path.exists(), "a run the harness rejects was kept"
    path.write_text("{not json", encoding="utf-8")
    assert baseline.cached_baseline(path, lambda: dict(SOUND), _accept) == (SOUND, False)
    assert baseline.cached_baseline(path, lambda: broken, _accept) == (SOUND, True)
    monkeypatch.setenv(baseline.FRESH_ENV, "1")
    assert baseline.cached_baseline(path, lambda: broken, _accept) == (broken, False)


def test_the_key_follows_the_inputs(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, suite = tmp_path / "python", tmp_path / "suite"
    first = baseline.baseline_path("0.19.1", python, suite)
    assert first == baseline.baseline_path("0.19.1", python, suite)
    assert first != baseline.baseline_path("0.17.2", python, suite)
    assert first != baseline.baseline_path("0.19.1", tmp_path / "other-venv", suite)
    # a source file of the stand-in Hub's world changes: another key
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "hubserver.py").write_text("A = 1\n", encoding="utf-8")
    (sources / "test_x.py").write_text("B = 1\n", encoding="utf-8")
    monkeypatch.setattr(baseline, "_SOURCES", (sources,))
    monkeypatch.setattr(baseline, "_TESTS", tmp_path)
    before = baseline.baseline_path("0.19.1", python, suite)
    (sources / "test_x.py").write_text("B = 2\n", encoding="utf-8")
    assert baseline.baseline_path("0.19.1", python, suite) == before, "a test file is no input"
    (sources / "hubserver.py").write_text("A = 2\n", encoding="utf-8")
    assert baseline.baseline_path("0.19.1", python, suite) != before
