"""The `systemd` marker: tests that boot systemd as PID 1 in a container (about a minute each).

`pytest -m "not systemd"` leaves them out; CI runs them like every other test.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "systemd: boots systemd as PID 1 in a systemd-nspawn container (needs root)"
    )
