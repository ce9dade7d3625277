"""Fixtures of the client tests: the Hub test server over the compiled example kernels, and
stores the daemon's code filled from it (no daemon process)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from kerneld.store import Store
from tests.client.support import ACTIVATION, RELU2, Populated, local_facts, populate
from tests.support.hubserver import HubServer


@pytest.fixture(scope="session")
def example_server(example_hub: HubRoot) -> Iterator[HubServer]:
    """A Hub test server over the example kernel repos (org trusted)."""
    with HubServer(example_hub.root, trusted_orgs={ORG: True}) as server:
        yield server


@pytest.fixture(scope="session")
def shared_store(
    example_server: HubServer, example_hub: HubRoot, tmp_path_factory: pytest.TempPathFactory
) -> Populated:
    """activation v1 + v2 and relu2 v1, every variant, published by the store code, with this
    machine's picks (as a daemon publishes them once a client of this platform asked): a warm
    load takes the warm fast path. Read-only: tests that change a store build their own
    (`fresh_store`)."""
    root = tmp_path_factory.mktemp("shared") / "store"
    populated = populate(
        root,
        example_server.url,
        example_hub,
        [(ACTIVATION, "v1"), (ACTIVATION, "v2"), (RELU2, "v1")],
    )
    Store.open(root, client_platforms=[local_facts()]).close()
    return populated


@pytest.fixture
def fresh_store(shared_store: Populated, tmp_path: Path) -> Populated:
    """A private copy of the shared store (modes, owners and the index kept)."""
    root = tmp_path / "store"
    shutil.copytree(shared_store.root, root, symlinks=True)
    return Populated(root, shared_store.commits)
