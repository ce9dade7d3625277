"""Fixtures of the integration tests: a Hub test server over the compiled example kernels, and a
real kerneld whose upstream is that server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer


@pytest.fixture
def hub(example_hub_server: HubServer) -> HubServer:
    """The example kernels' Hub test server (tests/fixtures_examples.py), fresh per test."""
    return example_hub_server


@pytest.fixture
def hub_daemon(make_daemon: Callable[..., DaemonProcess], hub: HubServer) -> DaemonProcess:
    """A real kerneld with an empty store whose upstream is the Hub test server."""
    return make_daemon(hub_endpoint=hub.url)
