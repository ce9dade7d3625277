"""Fixtures of the Hub API tests: venvs with released `kernels` and Transformers (made by `make
test-deps` into the suite's cache, else by whichever xdist worker asks first). The example
kernels' Hub test server is `example_hub_server` (tests/fixtures_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import deps


@pytest.fixture(scope="session")
def release_venvs() -> dict[str, Path]:
    """Requirement (`kernels==0.16.2`, `transformers==5.25.0`) -> the python of a venv with it
    from the registry."""
    return deps.release_venvs()
