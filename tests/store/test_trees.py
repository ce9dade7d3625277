"""Trees: canonical digests, dedupe, read-only materialisation, metadata.json digest checks."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld.store import (
    BlobMissingError,
    MetadataDigestError,
    MetadataError,
    Store,
    TreeFile,
    tree_digest,
)
from kerneld.store import trees as trees_mod
from kerneld.store.manifest import ManifestEntry, canonical_manifest, parse_manifest

from .conftest import (
    COMMIT_A,
    COMMIT_B,
    REPO,
    ingest_variant,
    metadata_for,
    publish,
    sha256,
    variant_files,
    walk_all,
)

entry_st = st.builds(
    ManifestEntry,
    path=st.from_regex(r"[a-z_]{1,8}(/[a-z_.]{1,8}){0,2}", fullmatch=True),
    mode=st.sampled_from([0o444, 0o555]),
    size=st.integers(0, 10**9),
    sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
)


@given(st.lists(entry_st, max_size=12, unique_by=lambda e: e.path), st.randoms())
@settings(max_examples=100, deadline=None)
def test_tree_digest_is_order_independent_and_roundtrips(entries, rnd):
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert tree_digest(entries) == tree_digest(shuffled)
    assert sorted(parse_manifest(canonical_manifest(entries))) == sorted(entries)


def test_tree_digest_changes_with_content_mode_and_path():
    e = ManifestEntry("a.py", 0o444, 3, "0" * 64)
    base = tree_digest([e])
    assert base.startswith("sha256:")
    assert tree_digest([ManifestEntry("b.py", 0o444, 3, "0" * 64)]) != base
    assert tree_digest([ManifestEntry("a.py", 0o555, 3, "0" * 64)]) != base
    assert tree_digest([ManifestEntry("a.py", 0o444, 3, "1" * 64)]) != base


def test_publish_is_read_only_everywhere(store):
    files = variant_files()
    files["pkg/sub/x.py"] = b"x = 1\n"
    info = publish(store, files=files)
    assert info.created
    for dirpath, _dirs, names in os.walk(info.path):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o555
        for name in names:
            st_ = os.lstat(os.path.join(dirpath, name))
            assert stat.S_ISREG(st_.st_mode)
            assert stat.S_IMODE(st_.st_mode) & 0o222 == 0
    assert (info.path / "pkg/sub/x.py").read_bytes() == b"x = 1\n"
    # files are hard links to their blobs
    blob = store.layout.blob_path(sha256(b"x = 1\n"))
    assert os.stat(blob).st_ino == os.stat(info.path / "pkg/sub/x.py").st_ino
    lock = info.lock_path
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644  # only the owner can take the write lock


def test_identical_content_is_stored_once(store):
    a = publish(store, repo=REPO, commit=COMMIT_A)
    b = publish(store, repo=REPO, commit=COMMIT_B)
    c = publish(store, repo="other-org/fork", commit=COMMIT_A, variant="torch-cuda")
    assert a.created and not b.created and not c.created
    assert a.digest == b.digest == c.digest
    assert len(os.listdir(store.layout.trees)) == 1
    assert store.catalog.lookup(REPO, COMMIT_B, "torch-cpu").digest == a.digest
    assert store.catalog.lookup("other-org/fork", COMMIT_A, "torch-cuda").path == a.path


def test_executable_files_are_copied_0555(store):
    files = ingest_variant(store, variant_files())
    exe = [
        TreeFile(f.path, f.sha256, f.size, mode=0o100755 if f.path == "_ops.py" else 0o100644)
        for f in files
    ]
    info = store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", exe)
    st_ = os.stat(info.path / "_ops.py")
    assert stat.S_IMODE(st_.st_mode) == 0o555
    assert st_.st_ino != os.stat(store.layout.blob_path(files[1].sha256)).st_ino
    assert store.space.usage().bytes_used > sum(f.size for f in files)
    assert store.repair.verify().clean


def test_copy_fallback_when_links_fail(store, monkeypatch):
    real_link = os.link

    def no_link(*a, **k):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(trees_mod.os, "link", no_link)
    info = publish(store)
    monkeypatch.setattr(trees_mod.os, "link", real_link)
    for f in info.path.iterdir():
        assert os.stat(f).st_nlink == 1
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o444
    assert store.repair.verify().clean


def test_copy_mode_option(store_root):
    with Store.open(store_root, use_hardlinks=False) as s:
        info = publish(s)
        assert all(os.stat(f).st_nlink == 1 for f in info.path.iterdir())
        assert s.repair.verify().clean


def test_missing_blob(store):
    files = ingest_variant(store, variant_files())
    ghost = TreeFile("ghost.so", "f" * 64, 10)
    with pytest.raises(BlobMissingError) as info:
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", [*files, ghost])
    assert info.value.missing == ["f" * 64]


def test_metadata_required(store):
    files = variant_files()
    tf = []
    for path, data in files.items():
        store.blobs.ingest(data, size=len(data), sha256=sha256(data))
        tf.append(TreeFile(path, sha256(data), len(data)))
    with pytest.raises(MetadataError, match="no metadata.json"):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", tf)


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_metadata_unparsable(store, raw):
    with pytest.raises(MetadataError):
        publish(store, metadata=raw)


def _digest_doc(files, algorithm="sha256", drop=None, add=None, corrupt=None):
    doc_files = {
        p: base64.b64encode(hashlib.new(algorithm, b).digest()).decode() for p, b in files.items()
    }
    if drop:
        del doc_files[drop]
    if add:
        doc_files[add] = base64.b64encode(b"\0" * 32).decode()
    if corrupt:
        doc_files[corrupt] = base64.b64encode(hashlib.new(algorithm, b"evil").digest()).decode()
    return json.dumps({"id": "k", "digest": {"algorithm": algorithm, "files": doc_files}}).encode()


def test_metadata_digest_sha512_ok(store):
    files = variant_files()
    info = publish(store, files=files, metadata=_digest_doc(files, "sha512"))
    assert info.metadata_digest_checked and info.metadata.digest_algorithm == "sha512"


@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"drop": "_ops.py"}, "missing"),
        ({"add": "evil.so"}, "unknown"),
        ({"corrupt": "__init__.py"}, "mismatched"),
    ],
)
def test_metadata_digest_failures(store, algorithm, kw, field):
    files = variant_files()
    with pytest.raises(MetadataDigestError) as info:
        publish(store, files=files, metadata=_digest_doc(files, algorithm, **kw))
    assert getattr(info.value, field)
    assert "re-run the build's hash step" in str(info.value)  # issue 18: the author's next step
    assert store.catalog.lookup(REPO, COMMIT_A, "torch-cpu") is None
    assert os.listdir(store.layout.trees) == []


@pytest.mark.parametrize(
    "digest",
    [
        {"algorithm": "md5", "files": {}},
        {"algorithm": "sha256"},
        "x",
        {"algorithm": "sha256", "files": {"_ops.py": "!!notbase64"}},
    ],
)
def test_metadata_digest_malformed(store, digest):
    files = variant_files()
    raw = json.dumps({"id": "k", "digest": digest}).encode()
    with pytest.raises(MetadataDigestError):
        publish(store, files=files, metadata=raw)


def test_metadata_digest_optional_unless_required(store_root):
    files = variant_files()
    raw = metadata_for(files, algorithm=None)
    with Store.open(store_root) as s:
        info = publish(s, files=files, metadata=raw)
        assert not info.metadata_digest_checked
    with (
        Store.open(store_root, require_metadata_digest=True) as s,
        pytest.raises(MetadataDigestError),
    ):
        publish(s, files=files, commit=COMMIT_B, metadata=raw)


def test_sigstore_file_excluded_from_digest(store):
    files = variant_files()
    meta = metadata_for(files)
    all_files = {**files, "metadata.json.sigstore": b"{}"}
    info = publish(store, files=all_files, metadata=meta)
    assert info.files == len(files) + 2


def test_failed_publish_leaves_no_staging(store, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(trees_mod, "_copy_verified", boom)
    files = ingest_variant(store, variant_files())
    exe = [TreeFile(f.path, f.sha256, f.size, mode=0o100755) for f in files]
    before = walk_all(store.layout.root)
    with pytest.raises(RuntimeError):
        store.trees.publish_tree(REPO, COMMIT_A, "torch-cpu", exe)
    assert walk_all(store.layout.root) == before


def test_upstream_ids_recorded(store):
    info = publish(store)
    ids = store.catalog.upstream_ids(REPO, COMMIT_A, "torch-cpu")
    assert len(ids) == info.files
