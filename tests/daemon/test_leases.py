"""Leases written behind (LeaseBook + store.leases.record) against a real store."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.server.services.leases import LeaseBook
from kerneld.store import Lease, Store, TreeFile
from tests.support.mirrors import variant

COMMIT = "c" * 40


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "store", min_age_s=0, orphan_grace_s=0)
    yield s
    s.close()


def publish(store: Store, ident: str, name: str = "torch-universal") -> str:
    entries = []
    for path, data in variant(ident).items():
        blob = store.blobs.ingest(data, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        entries.append(TreeFile(path=path, sha256=blob.sha256, size=len(data)))
    return store.trees.publish_tree("org/k", COMMIT, name, entries).digest


def test_leases_are_recorded_in_one_batch(store: Store) -> None:
    tree = publish(store, "_k_one")
    book = LeaseBook(store.leases, interval=3600)
    try:
        leases = [book.grant(tree, 60, f"rank{i}") for i in range(100)]
        assert store.leases.rows() == []  # written behind, not yet
        assert book.flush() == 100
        assert {row.id for row in store.leases.rows()} == {lease.id for lease in leases}
        assert len({lease.id for lease in leases}) == 100 and all(len(x.id) == 32 for x in leases)
        assert store.leases.renew(leases[0].id, 120).expires_at > time.time() + 100
    finally:
        book.close()


def test_gc_respects_a_flushed_lease_and_skips_dead_trees(store: Store) -> None:
    kept = publish(store, "_k_kept")
    gone = publish(store, "_k_gone", name="torch-cpu")
    lease = Lease("a" * 32, kept, time.time() + 60, "job")
    expired = Lease("b" * 32, kept, time.time() - 1, "job")
    store.names.pin("org/k", COMMIT, "torch-cpu")
    store.names.unpin("org/k", COMMIT, "torch-cpu")
    assert store.leases.record([lease, expired]) == 1
    store.gc.policy = type(store.gc.policy)(
        free_target_bytes=1 << 62, min_age_s=0, orphan_grace_s=0
    )
    report = store.gc.collect()
    assert {t.digest for t in report.deleted_trees} == {gone.removeprefix("sha256:")}
    assert [t.reason for t in report.kept_trees] == ["leased"]
    # A lease on a tree that is gone by the time the batch is written is dropped.
    assert store.leases.record([Lease("c" * 32, gone, time.time() + 60)]) == 0


def test_gc_keeps_trees_of_leases_not_yet_written(store: Store) -> None:
    """Issue 19: a lease granted a moment ago is only in the LeaseBook's memory; GC (a
    reservation's, which does not flush) must keep its tree all the same, and stop keeping it
    once the lease expired."""
    handed_out = publish(store, "_k_handed_out")
    other = publish(store, "_k_other", name="torch-cpu")
    book = LeaseBook(store.leases, interval=3600)
    store.gc.guard(book.unwritten_trees)
    try:
        book.grant(handed_out, 60, "job")
        book.grant(other, -1, "job")  # already expired: protects nothing
        assert store.leases.rows() == []
        store.gc.policy = type(store.gc.policy)(
            free_target_bytes=1 << 62, min_age_s=0, orphan_grace_s=0
        )
        report = store.gc.collect()
        assert {t.digest for t in report.deleted_trees} == {other.removeprefix("sha256:")}
        assert [t.reason for t in report.kept_trees] == [
            "held (a request in flight is fetching or serving it)"
        ]
    finally:
        book.close()


def test_resolve_times_are_written_behind(store: Store) -> None:
    tree = publish(store, "_k_lru")
    hexd = tree.removeprefix("sha256:")
    before = store.index.get_tree(hexd)
    assert before is not None
    book = LeaseBook(store.leases, interval=3600)
    try:
        time.sleep(0.01)
        book.resolved(tree)
        book.flush()
    finally:
        book.close()
    after = store.index.get_tree(hexd)
    assert after is not None and after.last_resolved > before.last_resolved
