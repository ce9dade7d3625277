"""Repositories compare and hash with `check_arch`, as in `kernels` 0.19.1 (its
test_repository_arch_check_affects_equality, run in tests/conformance): the same repository with
the arch check off is another mapping entry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kerneld_client import (
    FuncRepository,
    LayerRepository,
    LocalFuncRepository,
    LocalLayerRepository,
    LockedFuncRepository,
    LockedLayerRepository,
)

FACTORIES: dict[str, Callable[..., Any]] = {
    "LayerRepository": lambda **kw: LayerRepository("org/k", layer_name="L", version=1, **kw),
    "FuncRepository": lambda **kw: FuncRepository("org/k", func_name="f", version=1, **kw),
    "LocalLayerRepository": lambda **kw: LocalLayerRepository(Path("/k"), layer_name="L", **kw),
    "LocalFuncRepository": lambda **kw: LocalFuncRepository(Path("/k"), func_name="f", **kw),
    "LockedLayerRepository": lambda **kw: LockedLayerRepository(
        "org/k", lockfile=Path("/k.lock"), layer_name="L", **kw
    ),
    "LockedFuncRepository": lambda **kw: LockedFuncRepository(
        "org/k", lockfile=Path("/k.lock"), func_name="f", **kw
    ),
}


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_check_arch_is_part_of_equality(kind: str) -> None:
    make = FACTORIES[kind]
    default, checked, unchecked = make(), make(check_arch=True), make(check_arch=False)
    assert default == checked and hash(default) == hash(checked)
    assert checked != unchecked
    assert len({default, checked, unchecked}) == 2
