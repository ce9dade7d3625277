"""The store contracts (tests/store/conformance.py) against their implementations: the store a
daemon owns (`open_store`, what kerneld serves from), and the read-only store a job reads: the
same directory after the daemon stopped, and the store a container mounts read-only at another
path (docs/containers.md), where SQLite cannot create the files a reader normally makes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.store import Store, StoreHandle
from tests.store.conformance import ReaderConformance, StoreConformance


class TestStore(StoreConformance):
    def open_store(self, root: Path, *, read_only: bool = False) -> StoreHandle:
        if read_only:
            return Store.open(root, read_only=True)
        return Store.open(root, min_age_s=0, orphan_grace_s=0)


class TestReadOnlyStore(ReaderConformance):
    """The reader `kerneldctl --store` opens beside (or after) a daemon: same path."""

    def open_writer_store(self, root: Path) -> StoreHandle:
        return Store.open(root, min_age_s=0, orphan_grace_s=0)

    def open_reader(self, root: Path) -> StoreHandle:
        return Store.open(root, read_only=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
class TestStoreMountedReadOnlyElsewhere(ReaderConformance):
    """The host's store bind-mounted read-only at another path, as a container mounts it: every
    path a reader hands out is under the mount, and nothing on the file system can be created
    (the index is opened immutable)."""

    @pytest.fixture(autouse=True)
    def _mounts(self, tmp_path: Path) -> Iterator[None]:
        self._mounted: list[Path] = []
        yield
        for point in self._mounted:
            subprocess.run(["umount", str(point)], check=False)

    def open_writer_store(self, root: Path) -> StoreHandle:
        return Store.open(root, min_age_s=0, orphan_grace_s=0)

    def open_reader(self, root: Path) -> StoreHandle:
        point = root.parent / "container-view"
        point.mkdir()
        subprocess.run(["mount", "--bind", str(root), str(point)], check=True)
        self._mounted.append(point)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(point)], check=True)
        assert os.statvfs(point).f_flag & os.ST_RDONLY
        return Store.open(point, read_only=True)
