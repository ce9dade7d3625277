"""Fixtures of the Hub API tests: throw-away venvs with released `kernels` and Transformers
(built once per session, side by side). The example kernels' Hub test server is
`example_hub_server` (tests/fixtures_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hubapi.venvs import KERNELS_RELEASES, TRANSFORMERS_RELEASE, make_venvs


@pytest.fixture(scope="session")
def release_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Requirement (`kernels==0.16.2`, `transformers==5.25.0`) -> the python of a venv with it
    from the registry; all built once, side by side."""
    wanted = [f"kernels=={r}" for r in KERNELS_RELEASES]
    wanted.append(f"transformers=={TRANSFORMERS_RELEASE}")
    return make_venvs(tmp_path_factory.mktemp("release-venvs"), wanted)
