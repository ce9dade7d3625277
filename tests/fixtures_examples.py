"""Pytest plugin: the example kernels, built once per cache key, and Hub-style git repos of them.

The build is cached under $KERNELD_EXAMPLES_CACHE, which the suite points at the cache outside
the clone (tests/fixtures_testcache.py; `make test-deps` builds it first), so only the first run
on a machine (or after a source change) pays for compiling; later sessions and clones reuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from examples.kernels.build import build_examples, make_hub
from examples.kernels.built import BuiltExamples
from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from tests.support.hubserver import HubServer


@pytest.fixture(scope="session")
def built_examples() -> BuiltExamples:
    """Every example kernel, version and variant, built for the local torch (or from cache)."""
    return build_examples()


@pytest.fixture(scope="session")
def example_hub(built_examples: BuiltExamples, tmp_path_factory: pytest.TempPathFactory) -> HubRoot:
    """Non-bare git repos at <root>/kernels/kerneld-examples/{activation,relu2}, with details."""
    return make_hub(tmp_path_factory.mktemp("example-hub"), built=built_examples)


@pytest.fixture(scope="session")
def example_hub_root(example_hub: HubRoot) -> Path:
    """Root of the non-bare repos: <root>/kernels/<org>/<name> (olah's mirrors-path layout)."""
    return example_hub.root


@pytest.fixture(scope="session")
def example_hub_bare(
    built_examples: BuiltExamples, tmp_path_factory: pytest.TempPathFactory
) -> HubRoot:
    """The same repos in bare form (LFS objects under <repo>/lfs/objects)."""
    return make_hub(tmp_path_factory.mktemp("example-hub-bare"), bare=True, built=built_examples)


@pytest.fixture
def make_example_hub(built_examples: BuiltExamples, tmp_path: Path) -> Callable[..., HubRoot]:
    """Factory for a fresh, private hub root (for tests that modify the repos)."""

    def make(*, bare: bool = False, dest: Path | None = None) -> HubRoot:
        return make_hub(
            dest or tmp_path / ("hub-bare" if bare else "hub"), bare=bare, built=built_examples
        )

    return make


@pytest.fixture(scope="module")
def example_server(example_hub: HubRoot) -> Iterator[HubServer]:
    """A Hub test server over the example kernel repos (org trusted), one per module."""
    with HubServer(example_hub.root, trusted_orgs={ORG: True}) as server:
        yield server


@pytest.fixture
def example_hub_server(example_server: HubServer) -> Iterator[HubServer]:
    """The module's example server with fresh counters and no faults; fails the test on a
    server error."""
    example_server.reset()
    yield example_server
    errors = list(example_server.errors)
    example_server.reset()
    assert not errors, f"hub server raised: {errors}"
