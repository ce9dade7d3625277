"""Repositories compare and hash with `check_arch`, as in `kernels` 0.19.1 (its
test_repository_arch_check_affects_equality, run in tests/conformance): the same repository with
the arch check off is another mapping entry. They copy and pickle (a kernelized model holds the
repository of each kernel it uses), locked ones with the pin read so far."""

from __future__ import annotations

import copy
import json
import pickle
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


@pytest.mark.parametrize("kind", sorted(FACTORIES))
@pytest.mark.parametrize("check_arch", [True, False])
def test_repositories_copy_and_pickle(kind: str, check_arch: bool) -> None:
    repo = FACTORIES[kind](check_arch=check_arch)
    for restore in (copy.deepcopy, lambda r: pickle.loads(pickle.dumps(r))):
        restored = restore(repo)
        assert restored == repo and hash(restored) == hash(repo)
        assert (str(restored), repr(restored)) == (str(repo), repr(repo))


def test_a_restored_locked_repository_keeps_its_pin_and_reads_on_its_own(tmp_path: Path) -> None:
    lockfile = tmp_path / "kernels.lock"
    commit = "b" * 40
    lockfile.write_text(json.dumps([{"repo_id": "org/k", "sha": commit, "variants": {}}]))
    repo = LockedLayerRepository("org/k", lockfile=lockfile, layer_name="L")
    fresh = pickle.loads(pickle.dumps(repo))
    assert repo.pin()[0] == commit
    lockfile.write_text("{not json", encoding="utf-8")
    assert pickle.loads(pickle.dumps(repo)).pin()[0] == commit  # the pin travels
    with pytest.raises(ValueError):
        fresh.pin()  # pickled before the read: reads the lock file itself, with its own lock
