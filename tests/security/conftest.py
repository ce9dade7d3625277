"""Fixtures of the security tests: a store holding the compiled example kernels, and a
directory every user can traverse (pytest's tmp dirs are 0700)."""

from __future__ import annotations

import hashlib
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from kerneld.store import Store, TreeFile
from tests.security.support import (
    MEMBERS_GROUP,
    TESTER_NAME,
    group_member,
    nobody_kept_out,
    public_dir,
)

COMMIT = "7" * 40


@pytest.fixture(scope="session")
def example_store(built_examples: BuiltExamples, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every variant of activation v1 (the C++ `.so` build and the pure-Python ones), ingested
    and published by the real store code. Read-only: tests copy it (`example_copy`). (The
    daemon's fetch path is covered elsewhere; here only the published trees matter.)"""
    root = tmp_path_factory.mktemp("security-examples") / "store"
    kernel = built_examples.kernel("activation", 1)
    with Store.open(root, min_age_s=0) as store:
        for built in kernel.variants:
            files = []
            for rel in built.files:
                path = built.path / rel
                data = path.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                store.blobs.ingest(data, size=len(data), sha256=sha)
                mode = 0o100755 if path.stat().st_mode & 0o111 else 0o100644
                files.append(TreeFile(rel, sha, len(data), mode=mode))
            store.trees.publish_tree(kernel.repo_id, COMMIT, built.variant, files)
    return root


@pytest.fixture
def example_copy(example_store: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(example_store, root, symlinks=True)
    return root


@pytest.fixture
def public() -> Iterator[Path]:
    with public_dir() as base:
        yield base


@pytest.fixture
def member() -> Iterator[pwd.struct_passwd]:
    """`kerneld-tester` in kerneld-users for the test, with `nobody` kept an outsider meanwhile
    (both are machine-wide: tests of other xdist workers see them)."""
    with nobody_kept_out(), group_member(TESTER_NAME, MEMBERS_GROUP):
        yield pwd.getpwnam(TESTER_NAME)
