"""A job on an air-gapped host falls back within its own deadline (issue 16, 3.6).

The daemon's Hub endpoint accepts connections and never answers. The job's KERNELD_FETCH_TIMEOUT
is its deadline: the gRPC deadline reaches the daemon, which answers before it, and the job's
fallback warning names the upstream and what it said.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.support import client_env, run_client
from tests.daemon.test_bounded_wait import BlackHole
from tests.support.daemon import DaemonProcess

DEADLINE_S = 1.5
SLACK_S = 0.75


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    server = BlackHole()
    yield server
    server.close()


def test_a_job_falls_back_within_its_deadline_naming_the_upstream(
    make_daemon: Callable[..., DaemonProcess], black_hole: BlackHole, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:{black_hole.port}"
    daemon = make_daemon(hub_endpoint=endpoint, config={"fetch": {"timeout": 2, "attempts": 2}})
    env = client_env(
        None,
        tmp_path,
        KERNELD_SOCKET=str(daemon.user_socket),
        KERNELD_FETCH_TIMEOUT=str(DEADLINE_S),
    )
    out = run_client(
        """
import json, time, warnings
import kerneld_client
from kerneld_client.platform import platform_facts
platform_facts()  # torch import and detection: not part of the wait measured
FALLBACK = object()
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    start = time.monotonic()
    got = kerneld_client.get_kernel("kerneld-test/air-gapped", version=1, fallback=FALLBACK)
    took = time.monotonic() - start
print(json.dumps({"fell_back": got is FALLBACK, "took": took,
                  "warnings": [str(w.message) for w in seen]}))
""",
        env,
    )
    assert out["fell_back"], out
    assert out["took"] < DEADLINE_S + SLACK_S, out
    (warning,) = [w for w in out["warnings"] if "kerneld-test/air-gapped" in w]
    assert "using the fallback" in warning, warning
    assert f"hub ({endpoint})" in warning, warning
    assert black_hole.accepted >= 1
