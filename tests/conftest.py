"""Shared pytest configuration.

Fixtures live in plugin modules, one per concern, so they can grow independently:
- tests/fixtures_examples.py: the example kernels, built once and cached by source hash;
- tests/fixtures_hub.py: the Hub-compatible test server on 127.0.0.1.
"""

pytest_plugins = ["tests.fixtures_examples", "tests.fixtures_hub", "tests.fixtures_daemon"]
