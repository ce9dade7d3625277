"""Shared pytest configuration.

Fixtures live in plugin modules, one per concern, so they can grow independently:
- tests/fixtures_examples.py: the example kernels, built once and cached by source hash;
- tests/fixtures_hub.py: the Hub-compatible test server on 127.0.0.1;
- tests/fixtures_release_venvs.py: released `kernels` in clean venvs;
- tests/fixtures_testcache.py: the heavy set-up's cache outside the clone (`make test-deps`);
- tests/stall_timeout.py: a test's timeout is a window without CPU progress (hung), not wall clock.
"""

import os

# Before anything imports grpc: its fork handlers off in this process (tests/support/daemon.py).
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

pytest_plugins = [
    "tests.fixtures_testcache",
    "tests.fixtures_examples",
    "tests.fixtures_hub",
    "tests.fixtures_daemon",
    "tests.fixtures_release_venvs",
    "tests.scheduling",
    "tests.stall_timeout",
]
