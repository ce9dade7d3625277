"""Fixtures of the variant tests: the released `kernels` resolvers the drift tests compare with,
each in its own clean venv (built once per run, side by side, by whichever xdist worker asks
first) and kept running for the session."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.shared import shared_dir
from tests.variants.release_resolvers import RELEASES, ReleaseResolver, make_clean_venv


@pytest.fixture(scope="session")
def release_resolvers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, ReleaseResolver]]:
    """Release (`0.17.2`, `0.19.1`) -> its resolver, running in a venv holding only it."""
    with (
        shared_dir(tmp_path_factory, "variant-release-venvs") as root,
        ThreadPoolExecutor(max_workers=len(RELEASES)) as pool,
    ):
        futures = {
            r: pool.submit(make_clean_venv, root / f"kernels-{r}", f"kernels=={r}")
            for r in RELEASES
        }
        pythons = {r: f.result() for r, f in futures.items()}
    scratch = tmp_path_factory.mktemp("release-resolvers")
    resolvers = {r: ReleaseResolver(python, scratch / r) for r, python in pythons.items()}
    try:
        yield resolvers
    finally:
        for resolver in resolvers.values():
            resolver.close()
