"""Pytest plugin: the suite's cache outside the clone (tests/support/testcache.py), fixed for
the session before any test runs: tests change HOME and XDG_CACHE_HOME, and the daemons, jobs
and children they start must find the same entries `make test-deps` made."""

from __future__ import annotations

import os

import pytest

from examples.kernels.cache import CACHE_ENV as EXAMPLES_CACHE_ENV
from tests.support.testcache import CACHE_ENV, cache_dir, cache_root


def pytest_configure(config: pytest.Config) -> None:
    os.environ[CACHE_ENV] = str(cache_root())
    # The example builds too (build_examples() reads it): the same entry in every clone.
    os.environ.setdefault(EXAMPLES_CACHE_ENV, str(cache_dir("examples")))
