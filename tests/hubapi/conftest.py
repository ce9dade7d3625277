"""Fixtures of the Hub API tests: the example kernels on a Hub test server, and throw-away
venvs with released `kernels` (built once per session, side by side)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.kernels.build import ORG, HubRoot
from tests.hubapi.venvs import KERNELS_RELEASES, TRANSFORMERS_RELEASE, make_venvs
from tests.support.hubserver import HubServer


@pytest.fixture(scope="module")
def example_server(example_hub: HubRoot) -> Iterator[HubServer]:
    with HubServer(example_hub.root, trusted_orgs={ORG: True}) as server:
        yield server


@pytest.fixture
def examples(example_server: HubServer) -> Iterator[HubServer]:
    """The example kernels' Hub, fresh counters and no faults; fails the test on a server error."""
    example_server.reset()
    yield example_server
    errors = list(example_server.errors)
    example_server.reset()
    assert not errors, f"hub server raised: {errors}"


@pytest.fixture(scope="session")
def release_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Requirement (`kernels==0.16.2`, `transformers==5.25.0`) -> the python of a venv with it
    from the registry; all built once, side by side."""
    wanted = [f"kernels=={r}" for r in KERNELS_RELEASES]
    wanted.append(f"transformers=={TRANSFORMERS_RELEASE}")
    return make_venvs(tmp_path_factory.mktemp("release-venvs"), wanted)
