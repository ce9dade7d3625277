"""GC and quota: roots (pins, leases, held flocks, recent), LRU eviction, dry run, ENOSPC."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kerneld.store import ResourceExhaustedError, Store, TreeFile, hold_tree_lock
from kerneld.store.blobs import Expected
from kerneld.store.space import Space

from .conftest import COMMIT_A, COMMIT_B, REPO, ingest_variant, publish, sha256, variant_files

COMMITS = [c * 40 for c in "0123456789"]


def _publish_n(store, n, size=2000):
    """n trees with disjoint content, oldest resolved first."""
    infos = []
    for i in range(n):
        info = publish(store, commit=COMMITS[i], files=variant_files(seed=f"s{i}", size=size))
        infos.append(info)
    with store.index.tx() as conn:
        for i, info in enumerate(infos):
            conn.execute(
                "UPDATE trees SET last_resolved = ? WHERE digest = ?",
                (1000.0 + i, info.digest.removeprefix("sha256:")),
            )
    return infos


def _alive(store, info):
    """Published and present (without touching its resolve time, unlike lookup)."""
    row = store.index.get_variant(REPO, info.commit, info.variant)
    return row is not None and info.path.is_dir()


def test_gc_without_pressure_keeps_everything(store):
    infos = _publish_n(store, 3)
    report = store.gc.collect()
    assert report.deleted_trees == [] and report.blobs_deleted == []
    assert all(_alive(store, i) for i in infos)
    assert {t.reason for t in report.kept_trees} == {
        "not needed (usage within the cap and watermarks)"
    }


def test_unreferenced_tree_and_orphan_blobs_collected(store):
    old = publish(store, files=variant_files(seed="old"))
    new = publish(store, files=variant_files(seed="new"))  # same (repo, commit, variant)
    assert old.digest != new.digest
    report = store.gc.collect()
    assert [t.digest for t in report.deleted_trees] == [old.digest.removeprefix("sha256:")]
    assert not old.path.exists() and not old.lock_path.exists()
    assert report.blobs_deleted
    assert all(not store.layout.blob_path(b).exists() for b in report.blobs_deleted)
    assert _alive(store, new)
    assert store.repair.verify().clean


def test_young_orphan_blobs_survive_grace(store_root):
    with Store.open(store_root, orphan_grace_s=3600) as s:
        data = b"ingested for a publish that has not happened yet"
        s.blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert s.gc.collect().blobs_deleted == []
        assert s.blobs.has_blob(sha256(data))


def test_lru_eviction_under_cap(store_root):
    with Store.open(store_root, min_age_s=0, orphan_grace_s=0) as s:
        infos = _publish_n(s, 4)
        per_tree = s.space.usage().bytes_used // 4
        s.gc.policy = type(s.gc.policy)(
            cap_bytes=per_tree * 3, min_age_s=0, orphan_grace_s=0, target_fraction=0.9
        )
        report = s.gc.collect()
        deleted = [t.digest for t in report.deleted_trees]
        # oldest two go: usage must drop to <= 90% of 3 trees
        assert deleted == [i.digest.removeprefix("sha256:") for i in infos[:2]]
        assert all(t.reason.startswith("evicted") for t in report.deleted_trees)
        assert not _alive(s, infos[0]) and _alive(s, infos[2]) and _alive(s, infos[3])
        assert s.space.usage().bytes_used <= per_tree * 3 * 0.9
        assert s.repair.verify().clean


def test_roots_are_kept_and_dry_run_explains(store_root, monkeypatch):
    with Store.open(store_root, min_age_s=0, orphan_grace_s=0) as s:
        infos = _publish_n(s, 5)
        s.names.set_ref(REPO, "v1", infos[0].commit)
        s.names.pin(REPO, "v1")  # pins via a ref
        s.leases.acquire(infos[1].digest, 600)
        fd = os.open(infos[2].lock_path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)  # a client older than OFD locks: GC still respects it
        with s.index.tx() as conn:  # infos[3] was resolved just now
            conn.execute(
                "UPDATE trees SET last_resolved = ? WHERE digest = ?",
                (time.time(), infos[3].digest.removeprefix("sha256:")),
            )
        s.gc.policy = type(s.gc.policy)(cap_bytes=1, min_age_s=300, orphan_grace_s=0)
        dry = s.gc.collect(dry_run=True)
        reasons = {t.digest: (t.action, t.reason) for t in dry.trees}
        h = [i.digest.removeprefix("sha256:") for i in infos]
        assert reasons[h[0]][0] == "keep" and reasons[h[0]][1].startswith("pinned")
        assert reasons[h[1]] == ("keep", "leased")
        assert reasons[h[2]] == ("keep", "in use (a process holds its lock)")
        assert reasons[h[3]][0] == "keep" and reasons[h[3]][1].startswith("recent")
        assert reasons[h[4]][0] == "delete"
        assert dry.dry_run and dry.bytes_freed > 0
        assert all(_alive(s, i) for i in infos)  # dry run changed nothing
        report = s.gc.collect()
        assert [t.digest for t in report.deleted_trees] == [h[4]]
        assert all(_alive(s, i) for i in infos[:4]) and not _alive(s, infos[4])
        os.close(fd)
        s.names.unpin(REPO, "v1")
        with s.index.tx() as conn:
            conn.execute("DELETE FROM leases")
            conn.execute("UPDATE trees SET last_resolved = 0")
        report = s.gc.collect()
        assert len(report.deleted_trees) == 4
        assert s.space.usage().bytes_used == 0
        assert s.repair.verify().clean


@pytest.fixture
def public_root():
    """A store root every user can reach (pytest's tmp dirs are 0700)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="kerneld-store-test-"))
    base.chmod(0o755)
    yield base / "store"
    shutil.rmtree(base, ignore_errors=True)


def test_lock_held_by_other_user_is_respected(public_root):
    nobody = pwd.getpwnam("nobody")
    with Store.open(public_root, min_age_s=0, orphan_grace_s=0) as s:
        (info,) = _publish_n(s, 1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: drop to nobody, take LOCK_SH, report, wait
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                with hold_tree_lock(info.lock_path, info.path):
                    os.listdir(info.path)  # nobody can read the tree
                    os.write(w, b"locked")
                    time.sleep(30)
            except BaseException as exc:
                os.write(w, f"error {exc!r}".encode())
            finally:
                os._exit(0)
        os.close(w)
        try:
            assert os.read(r, 200) == b"locked"
            s.gc.policy = type(s.gc.policy)(cap_bytes=1, min_age_s=0, orphan_grace_s=0)
            report = s.gc.collect()
            assert report.deleted_trees == []
            assert report.kept_trees[0].reason == "in use (a process holds its lock)"
            assert info.path.is_dir()
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(r)
        assert len(s.gc.collect().deleted_trees) == 1
        assert not info.path.exists()
        with pytest.raises(FileNotFoundError), hold_tree_lock(info.lock_path, info.path):
            pass


def test_cap_enforced_before_writing(store_root):
    with Store.open(store_root, cap_bytes=10_000, min_age_s=0, orphan_grace_s=0) as s:
        (info,) = _publish_n(s, 1, size=500)
        s.names.pin(REPO)
        data = os.urandom(20_000)
        before = s.space.usage().bytes_used
        with pytest.raises(ResourceExhaustedError) as exc:
            s.blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert exc.value.limit == "size cap"
        assert "resource exhausted" in str(exc.value)
        assert list(s.layout.ingest.iterdir()) == []
        assert s.space.usage().bytes_used == before and s.space.usage().bytes_reserved == 0
        # unpinned, the automatic GC makes room by evicting the old tree
        s.names.unpin(REPO)
        data = os.urandom(8_000)
        s.blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert not info.path.exists()


def test_free_space_watermark(store_root):
    # The disk is shared with other processes: leave a 64 MiB margin for its free space to drift.
    free = shutil.disk_usage(store_root.parent).free
    with Store.open(store_root, min_free_bytes=free - 1000) as s:
        with pytest.raises(ResourceExhaustedError) as exc:
            s.blobs.ingest(iter([b""]), size=64 << 20, sha256="0" * 64)
        assert exc.value.limit == "free-space watermark"


def _mount_small_fs(where: Path) -> str | None:
    """Mount a 2 MiB file system at ``where``; return how, or None if impossible."""
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True
    )
    if r.returncode == 0:
        return "tmpfs"
    img = where.parent / "fs.img"
    with open(img, "wb") as f:
        f.truncate(4 << 20)
    if subprocess.run(["mkfs.ext4", "-q", str(img)], capture_output=True).returncode != 0:
        return None
    r = subprocess.run(
        ["mount", "-o", "loop", str(img), str(where)], capture_output=True, timeout=30
    )
    return "loop ext4" if r.returncode == 0 else None


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    how = _mount_small_fs(mnt)
    if how is None:
        pytest.skip("cannot mount a small tmpfs or loop file system here (needs root + mount)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_is_typed_and_leaves_nothing_half_done(small_fs, monkeypatch):
    root = small_fs / "store"
    with Store.open(root, min_age_s=0, orphan_grace_s=0) as s:
        info = publish(s)
        # 1) the reservation sees the real free space (statvfs) and refuses up front
        big = os.urandom(3 << 20)
        with pytest.raises(ResourceExhaustedError):
            s.blobs.ingest(big, size=len(big), sha256=sha256(big))
        # 2) if the disk fills behind our back, the write's ENOSPC becomes the same error
        monkeypatch.setattr(Space, "free_bytes", lambda self: 1 << 40)
        with pytest.raises(ResourceExhaustedError):
            s.blobs.ingest(big, size=len(big), sha256=sha256(big))
        assert list(s.layout.ingest.iterdir()) == []
        # 3) a publish that must copy and runs out of space publishes nothing
        filler = os.urandom(1 << 20)
        s.blobs.ingest(filler, size=len(filler), sha256=sha256(filler))
        files = ingest_variant(s, {**variant_files(seed="exe", size=100), "big.bin": filler})
        exe = [
            TreeFile(f.path, f.sha256, f.size, mode=0o100755 if f.path == "big.bin" else 0o644)
            for f in files
        ]
        with pytest.raises(ResourceExhaustedError):
            s.trees.publish_tree(REPO, COMMIT_B, "torch-cpu", exe)
        assert s.catalog.lookup(REPO, COMMIT_B, "torch-cpu") is None
        assert list(s.layout.staging.iterdir()) == []
        assert len(os.listdir(s.layout.trees)) == 1
        assert s.catalog.lookup(REPO, COMMIT_A, "torch-cpu").path == info.path
        assert s.repair.verify().clean
        monkeypatch.undo()
    with Store.open(root) as s:
        assert s.repair.verify().clean


def test_gc_does_not_block_lookups_for_long(store_root):
    """Deleting files happens outside the index lock: lookups proceed during a big sweep."""
    import threading

    with Store.open(store_root, min_age_s=0, orphan_grace_s=0) as s:
        infos = _publish_n(s, 6, size=20_000)
        keep = infos[-1]
        s.names.pin(REPO, keep.commit)
        s.gc.policy = type(s.gc.policy)(cap_bytes=1, min_age_s=0, orphan_grace_s=0)
        worst = 0.0
        stop = threading.Event()

        def resolver():
            nonlocal worst
            while not stop.is_set():
                t0 = time.perf_counter()
                assert s.catalog.lookup(REPO, keep.commit, "torch-cpu") is not None
                worst = max(worst, time.perf_counter() - t0)

        t = threading.Thread(target=resolver)
        t.start()
        report = s.gc.collect()
        stop.set()
        t.join()
        assert len(report.deleted_trees) == 5
        assert worst < 0.5


def test_expected_writer_releases_reservation_on_error(store_root):
    with Store.open(store_root, cap_bytes=1000) as s:
        w = s.blobs.open_writer(Expected(800, sha256="0" * 64))
        assert s.space.usage().bytes_reserved == 800
        with pytest.raises(ResourceExhaustedError):
            s.blobs.open_writer(Expected(800, sha256="1" * 64))
        w.abort()
        assert s.space.usage().bytes_reserved == 0


def test_a_hold_keeps_a_variant_from_reservation_gc(store_root):
    """Issue 19: a tree fetched for a request must survive the next reservation's GC until the
    request has it. Without the hold the same reservation evicts it (the control half)."""
    with Store.open(store_root, cap_bytes=10_000, min_age_s=0, orphan_grace_s=0) as s:
        (info,) = _publish_n(s, 1, size=500)
        data = os.urandom(8_000)
        with s.holds.hold() as hold:
            hold.add(REPO, info.commit, info.variant)
            with pytest.raises(ResourceExhaustedError) as exc:
                s.blobs.ingest(data, size=len(data), sha256=sha256(data))
            assert exc.value.limit == "size cap"
            assert _alive(s, info)
            report = s.gc.collect(dry_run=True)
            (kept,) = [t for t in report.trees if t.digest == info.digest.removeprefix("sha256:")]
            assert kept.reason.startswith("held")
        assert s.holds.held() == set()
        s.blobs.ingest(data, size=len(data), sha256=sha256(data))  # released: GC makes room
        assert not _alive(s, info)


def test_a_hold_counts_every_holder(store_root):
    """Two requests hold the same variant (a shared single-flight fetch): the first to finish
    must not release the second's protection."""
    with Store.open(store_root, cap_bytes=10_000, min_age_s=0, orphan_grace_s=0) as s:
        (info,) = _publish_n(s, 1, size=500)
        key = (REPO, info.commit, info.variant)
        with s.holds.hold() as second:
            with s.holds.hold() as first:
                first.add(*key)
                second.add(*key)
                first.add(*key)  # adding twice in one hold counts once
            assert s.holds.held() == {key}
            data = os.urandom(8_000)
            with pytest.raises(ResourceExhaustedError):
                s.blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert s.holds.held() == set()


def test_gc_guards_keep_unwritten_leases(store_root):
    """The daemon grants leases in memory and writes them behind: a guard vouches for them so
    a reservation cannot evict a tree handed out a moment ago."""
    with Store.open(store_root, cap_bytes=10_000, min_age_s=0, orphan_grace_s=0) as s:
        (info,) = _publish_n(s, 1, size=500)
        granted = {info.digest}
        s.gc.guard(lambda: granted)
        data = os.urandom(8_000)
        with pytest.raises(ResourceExhaustedError):
            s.blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert _alive(s, info)
        granted.clear()
        s.blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert not _alive(s, info)


def test_gc_purges_more_dead_trees_and_blobs_than_one_batch(store):
    """Purging goes in batches (64 trees, 512 blobs a round, each asked of the index with a
    LIMIT): every batch is done, and the store verifies clean after."""
    infos = [
        publish(store, files=variant_files(seed=f"batch-{i}", size=64)) for i in range(70)
    ]  # each publish replaces the last: 69 unreferenced trees
    report = store.gc.collect()
    assert len(report.deleted_trees) == 69
    assert not any(i.path.exists() for i in infos[:-1]) and _alive(store, infos[-1])
    assert store.index.tree_digests("dead") == [] and store.index.blob_digests("dead") == []
    assert store.repair.verify().clean
