"""`kerneld.store.Store` against the store contract (tests/store/conformance.py)."""

from __future__ import annotations

from pathlib import Path

from kerneld.store import Store
from tests.store.conformance import StoreConformance


class TestStore(StoreConformance):
    def open_store(self, root: Path, *, read_only: bool = False) -> Store:
        if read_only:
            return Store.open(root, read_only=True)
        return Store.open(root, min_age_s=0, orphan_grace_s=0)
