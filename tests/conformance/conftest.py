"""The stand-in Hub of the conformance tests: one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.standins import TRUSTED_ORGS, build_standins
from tests.support.hubserver import HubServer


@pytest.fixture(scope="module")
def standin_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("standin-hub")
    build_standins(root)
    with HubServer(root, trusted_orgs=dict.fromkeys(TRUSTED_ORGS, True)) as server:
        yield server
