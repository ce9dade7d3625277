"""verify / repair: corrupt, missing, untrusted, unknown and I/O errors; exit bitmask."""

from __future__ import annotations

import errno
import os

import pytest

from kerneld.store import Store
from kerneld.store import verify as verify_mod

from .conftest import COMMIT_A, REPO, publish


def _writable(path):
    os.chmod(path, 0o644)


def test_clean_store(store):
    publish(store)
    report = store.repair.verify()
    assert report.clean and report.exit_code == 0
    assert report.blobs_checked == 6 and report.trees_checked == 1


def test_corrupt_blob_detected_and_repaired(store):
    info = publish(store)
    victim = info.path / "_ops.py"
    os.chmod(victim, 0o644)
    victim.write_bytes(b"evil = True\n")  # same inode as the blob: both are corrupt now
    os.chmod(victim, 0o444)
    report = store.repair.verify()
    assert report.exit_code & verify_mod.CORRUPT
    assert {p.object for p in report.problems} >= {"blob"}
    seen = []
    report = store.repair.verify(repair=True, on_invalidated=lambda *a: seen.append(a))
    assert seen == [(REPO, COMMIT_A, "torch-cpu")]
    assert store.catalog.lookup(REPO, COMMIT_A, "torch-cpu") is None
    assert not info.path.exists()
    assert store.repair.verify().clean
    # re-fetch works: publishing again restores the tree
    again = publish(store)
    assert again.created and store.repair.verify().clean


def test_missing_blob_and_tree_file(store):
    info = publish(store)
    os.unlink(store.layout.blob_path(info.metadata and _sha(info, "__init__.py")))
    report = store.repair.verify()
    assert report.exit_code == verify_mod.CORRUPT
    assert any(p.kind == "missing" and p.object == "blob" for p in report.problems)


def _sha(info, rel):
    import hashlib

    return hashlib.sha256((info.path / rel).read_bytes()).hexdigest()


def test_untrusted_modes_and_symlinks(store):
    info = publish(store)
    os.chmod(info.path, 0o755)  # writable tree dir
    report = store.repair.verify()
    assert report.exit_code == verify_mod.UNTRUSTED
    os.chmod(info.path, 0o555)
    target = info.path / "_ops.py"
    os.chmod(info.path, 0o755)
    os.unlink(target)
    os.symlink("/etc/passwd", target)
    os.chmod(info.path, 0o555)
    report = store.repair.verify()
    assert report.exit_code & verify_mod.UNTRUSTED
    assert any("symlink" in p.detail for p in report.problems)
    store.repair.verify(repair=True)
    assert store.repair.verify().clean
    assert store.catalog.lookup(REPO, COMMIT_A, "torch-cpu") is None


def test_wrong_owner_is_untrusted(store):
    info = publish(store)
    os.chown(info.path / "_ops.py", 65534, 65534)
    report = store.repair.verify()
    assert report.exit_code == verify_mod.UNTRUSTED
    assert any("(uid 65534), not by the store's owner" in p.detail for p in report.problems)


def test_extra_file_in_tree_is_corrupt(store):
    info = publish(store)
    os.chmod(info.path, 0o755)
    (info.path / "injected.py").write_text("import os")
    os.chmod(info.path / "injected.py", 0o444)
    os.chmod(info.path, 0o555)
    report = store.repair.verify()
    assert report.exit_code == verify_mod.CORRUPT


def test_unknown_files_reported_and_removed(store):
    publish(store)
    stray = store.layout.blobs / "ab" / ("ab" + "0" * 62)
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"?")
    stray_tree = store.layout.trees / ("c" * 64)
    stray_tree.mkdir()
    report = store.repair.verify()
    kinds = {p.kind for p in report.problems}
    assert kinds == {"unknown"} and report.exit_code == 0 and not report.clean
    store.repair.verify(repair=True)
    assert not stray.exists() and not stray_tree.exists()
    assert store.repair.verify().clean


def test_io_errors_are_reported_and_verification_goes_on(store, monkeypatch):
    info = publish(store)
    bad = store.layout.blob_path(_sha(info, "_ops.py"))
    real_open = verify_mod.open_for_hash

    def flaky(path):
        if path == bad:
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path)

    monkeypatch.setattr(verify_mod, "open_for_hash", flaky)
    report = store.repair.verify()
    assert report.exit_code == verify_mod.IO_ERROR
    assert report.blobs_checked == 6 and report.trees_checked == 1
    io = [p for p in report.problems if p.kind == "io"]
    assert len(io) == 1  # the tree file (same inode, other path) was hashed on its own
    store.repair.verify(repair=True)
    monkeypatch.undo()
    assert store.repair.verify().clean


def test_verify_read_only_on_stopped_store(store_root):
    with Store.open(store_root) as s:
        publish(s)
    ro = Store.open(store_root, read_only=True)
    try:
        assert ro.repair.verify().clean
    finally:
        ro.close()


def test_exit_code_combines_bits():
    report = verify_mod.VerifyReport()
    report.add("corrupt", "blob", "x", "p", "d")
    report.add("io", "blob", "y", "p", "d")
    assert report.exit_code == 5
    report.add("untrusted", "tree", "z", "p", "d")
    assert report.exit_code == 7


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o4444])
def test_blob_mode_must_be_0444(store, mode):
    info = publish(store)
    os.chmod(store.layout.blob_path(_sha(info, "_ops.py")), mode)
    assert store.repair.verify().exit_code & verify_mod.UNTRUSTED
