"""Pytest plugin: released `kernels`, each in a clean venv holding only what pip resolves for it
(tests/variants/release_resolvers.py builds them): the drift tests' resolvers, and the check
that the example kernels load with an unmodified `kernels` 0.19.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import deps


@pytest.fixture(scope="session")
def clean_release_venvs() -> dict[str, Path]:
    """Release (`0.17.2`, `0.19.1`) -> the python of a venv holding only `kernels==<release>`
    and its dependencies (`make test-deps` made them; else the first worker to ask)."""
    return deps.clean_release_venvs()
