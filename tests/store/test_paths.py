"""Untrusted input: every bad path or manifest is rejected with a typed error, nothing written."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld.store import (
    DuplicatePathError,
    InvalidInputError,
    InvalidPathError,
    PathConflictError,
    TreeFile,
    UnsupportedFileTypeError,
)
from kerneld.store.errors import InvalidRepoError, InvalidRevisionError
from kerneld.store.paths import validate_relpath, validate_repo

from .conftest import COMMIT_A, REPO, ingest_variant, variant_files, walk_all

BAD_PATHS = [
    ("", "empty"),
    ("/etc/passwd", "absolute"),
    ("../escape", "'..'"),
    ("a/../../escape", "'..'"),
    ("a/./b", "'.'"),
    ("a//b", "empty path component"),
    ("a/", "empty path component"),
    ("a\x00b", "NUL"),
    ("a\nb", "control character"),
    ("a\\..\\b", "backslash"),
    ("x" * 256, "longer than 255"),
    ("/".join(["d" * 200] * 21), "longer than 4096"),
    ("\udcff", "UTF-8"),
]


@pytest.mark.parametrize(("path", "why"), BAD_PATHS)
def test_validate_relpath_rejects(path, why):
    with pytest.raises(InvalidPathError) as info:
        validate_relpath(path)
    assert why.lower() in str(info.value).lower()


@pytest.mark.parametrize("path", ["a", "a/b/c.py", "_ops.py", "x" * 255, "é/ü.so", "a b"])
def test_validate_relpath_accepts(path):
    assert validate_relpath(path) == path


def test_non_string_path():
    with pytest.raises(InvalidPathError):
        validate_relpath(b"abc")


@pytest.mark.parametrize("repo", ["org", "a/b/c", "../x", "org/..", "/abs", "org/na me", ""])
def test_bad_repo(repo):
    with pytest.raises(InvalidRepoError):
        validate_repo(repo)


@given(st.text(min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_accepted_paths_never_escape(path):
    """Property: whatever validate_relpath accepts stays under its base directory."""
    try:
        validate_relpath(path)
    except InvalidPathError:
        return
    base = "/base/dir"
    joined = os.path.normpath(os.path.join(base, path))
    assert joined.startswith(base + "/")
    assert ".." not in path.split("/")


@pytest.mark.parametrize(("path", "_why"), BAD_PATHS)
def test_publish_rejects_bad_paths_and_writes_nothing(store, path, _why):
    files = ingest_variant(store, variant_files())
    before = walk_all(store.layout.root)
    bad = [*files, TreeFile(path, files[0].sha256)]
    with pytest.raises(InvalidPathError):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", bad)
    assert walk_all(store.layout.root) == before
    assert store.catalog.lookup(REPO, COMMIT_A, "torch-cpu") is None


def test_publish_rejects_duplicates(store):
    files = ingest_variant(store, variant_files())
    with pytest.raises(DuplicatePathError):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", [*files, files[1]])


def test_publish_rejects_file_dir_conflict(store):
    files = ingest_variant(store, variant_files())
    conflict = [*files, TreeFile("_ops.py/inner", files[0].sha256)]
    with pytest.raises(PathConflictError):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", conflict)


@pytest.mark.parametrize(
    ("mode", "what"),
    [
        (0o120000, "symlink"),
        (0o160000, "submodule"),
        (0o020644, "file type"),
        (0o060644, "file type"),
    ],
)
def test_publish_rejects_special_files(store, mode, what):
    files = ingest_variant(store, variant_files())
    bad = [*files, TreeFile("link", files[0].sha256, mode=mode)]
    with pytest.raises(UnsupportedFileTypeError, match=what):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", bad)


def test_publish_rejects_lying_size(store):
    from kerneld.store import SizeMismatchError

    files = ingest_variant(store, variant_files())
    f0 = files[0]
    liar = TreeFile(f0.path, f0.sha256, (f0.size or 0) + 1)
    with pytest.raises(SizeMismatchError):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", [liar, *files[1:]])


@pytest.mark.parametrize(
    ("repo", "commit", "variant", "exc"),
    [
        ("bad", COMMIT_A, "torch-cpu", InvalidRepoError),
        (REPO, "main", "torch-cpu", InvalidRevisionError),
        (REPO, "A" * 40, "torch-cpu", InvalidRevisionError),
        (REPO, COMMIT_A, "a/b", InvalidPathError),
        (REPO, COMMIT_A, "..", InvalidPathError),
    ],
)
def test_publish_rejects_bad_names(store, repo, commit, variant, exc):
    files = ingest_variant(store, variant_files())
    with pytest.raises(exc):
        store.trees.publish_tree(repo, commit, variant, files)


def test_publish_rejects_bad_sha(store):
    files = ingest_variant(store, variant_files())
    with pytest.raises(InvalidInputError):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", [*files, TreeFile("x", "zz")])


def test_ingest_file_rejects_symlink_device_fifo(store, tmp_path):
    from kerneld.store import UnsupportedFileTypeError

    target = tmp_path / "real"
    target.write_bytes(b"hello")
    link = tmp_path / "link"
    link.symlink_to(target)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (link, fifo, "/dev/null"):
        with pytest.raises(UnsupportedFileTypeError):
            store.blobs.ingest_file(path, sha256="0" * 64)
    info = store.blobs.ingest_file(
        target, sha256=__import__("hashlib").sha256(b"hello").hexdigest()
    )
    assert info.size == 5
