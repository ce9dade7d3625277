"""Pytest plugin: released `kernels`, each in a clean venv holding only what pip resolves for it
(tests/variants/release_resolvers.py builds them): the drift tests' resolvers, and the check
that the example kernels load with an unmodified `kernels` 0.19.1."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.shared import shared_dir
from tests.variants.release_resolvers import RELEASES, make_clean_venv


@pytest.fixture(scope="session")
def clean_release_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Release (`0.17.2`, `0.19.1`) -> the python of a venv holding only `kernels==<release>`
    and its dependencies; built once per run, side by side, by whichever xdist worker asks
    first."""
    with (
        shared_dir(tmp_path_factory, "variant-release-venvs") as root,
        ThreadPoolExecutor(max_workers=len(RELEASES)) as pool,
    ):
        futures = {
            r: pool.submit(make_clean_venv, root / f"kernels-{r}", f"kernels=={r}")
            for r in RELEASES
        }
        return {r: f.result() for r, f in futures.items()}
