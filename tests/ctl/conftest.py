"""Fixtures of the kerneldctl tests: a Hub with kernel-depends chains, served on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hubserver import HubServer
from tests.support.lockhub import ORG, LockHub, build_lock_hub


@pytest.fixture(scope="session")
def lock_hub(tmp_path_factory: pytest.TempPathFactory) -> LockHub:
    return build_lock_hub(tmp_path_factory.mktemp("lock-hub"))


@pytest.fixture(scope="session")
def lock_hub_server(lock_hub: LockHub) -> Iterator[HubServer]:
    with HubServer(lock_hub.root, trusted_orgs={ORG: True}) as server:
        yield server
