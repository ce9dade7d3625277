"""Fixtures of the variant tests: the released `kernels` resolvers the drift tests compare with,
each running in its own clean venv (tests/fixtures_release_venvs.py) for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.variants.release_resolvers import ReleaseResolver


@pytest.fixture(scope="session")
def release_resolvers(
    clean_release_venvs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ReleaseResolver]]:
    """Release (`0.17.2`, `0.19.1`) -> its resolver, running in a venv holding only it."""
    scratch = tmp_path_factory.mktemp("release-resolvers")
    resolvers = {r: ReleaseResolver(py, scratch / r) for r, py in clean_release_venvs.items()}
    try:
        yield resolvers
    finally:
        for resolver in resolvers.values():
            resolver.close()
