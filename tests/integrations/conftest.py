"""Fixtures of the integration tests: a Hub test server over the compiled example kernels, and a
real kerneld whose upstream is that server."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from examples.kernels.build import ORG, HubRoot
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer


@pytest.fixture(scope="module")
def example_server(example_hub: HubRoot) -> Iterator[HubServer]:
    """A Hub test server over the example kernel repos (org trusted), one per module."""
    with HubServer(example_hub.root, trusted_orgs={ORG: True}) as server:
        yield server


@pytest.fixture
def hub(example_server: HubServer) -> Iterator[HubServer]:
    """The module's server with fresh counters; fails the test on a server error."""
    example_server.reset()
    yield example_server
    errors = list(example_server.errors)
    example_server.reset()
    assert not errors, f"hub server raised: {errors}"


@pytest.fixture
def hub_daemon(make_daemon: Callable[..., DaemonProcess], hub: HubServer) -> DaemonProcess:
    """A real kerneld with an empty store whose upstream is the Hub test server."""
    return make_daemon(hub_endpoint=hub.url)
