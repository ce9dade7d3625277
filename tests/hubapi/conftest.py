"""Fixtures of the Hub API tests: throw-away venvs with released `kernels` and Transformers
(built once per run, side by side, by whichever xdist worker asks first). The example kernels'
Hub test server is `example_hub_server` (tests/fixtures_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hubapi.venvs import KERNELS_RELEASES, TRANSFORMERS_RELEASE, make_venvs
from tests.support.shared import shared_dir


@pytest.fixture(scope="session")
def release_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Requirement (`kernels==0.16.2`, `transformers==5.25.0`) -> the python of a venv with it
    from the registry; all built once, side by side."""
    wanted = [f"kernels=={r}" for r in KERNELS_RELEASES]
    wanted.append(f"transformers=={TRANSFORMERS_RELEASE}")
    with shared_dir(tmp_path_factory, "release-venvs") as root:
        return make_venvs(root, wanted)
