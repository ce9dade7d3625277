"""`kernels` 0.19.1's own test suite, plain, through kerneld's start-up hook and on kerneld's API
under every public `kernels` name (tests/conformance/harness.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conformance.harness import run_conformance
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_kernels_0191_suite_passes_through_kerneld(
    standin_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_conformance("0.19.1", standin_hub, make_daemon, tmp_path, tmp_path_factory)
