"""Index, refs, denies, pins, leases, negative cache, owner lock and the published index."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from kerneld.store import (
    DeniedError,
    LeaseNotFoundError,
    ReadOnlyStoreError,
    SchemaError,
    Store,
    StoreLockedError,
    TreeNotFoundError,
    UnresolvedDenyError,
    published_index,
)
from kerneld.store.gc import pinned_trees
from kerneld.store.index import SCHEMA_VERSION

from .conftest import COMMIT_A, COMMIT_B, REPO, publish


def test_schema_version_and_wal(store):
    conn = sqlite3.connect(store.layout.db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert stat.S_IMODE(store.layout.db.stat().st_mode) == 0o600


def test_dead_rows_are_found_without_a_scan(store):
    """GC's purge and recovery ask for dead trees and blobs a batch at a time among many live
    ones: each ask must be an index search, not a scan of every row (145 ms a batch at
    100,000 trees; bench scenario 6). The plans are those of the statements the index runs."""
    statements: list[str] = []
    store.index.conn.set_trace_callback(statements.append)
    try:
        assert store.index.tree_digests("dead", limit=64) == []
        assert store.index.blob_digests("dead", limit=512) == []
    finally:
        store.index.conn.set_trace_callback(None)
    asks = [q for q in statements if q.lstrip().upper().startswith("SELECT")]
    assert len(asks) == 2, statements
    conn = sqlite3.connect(store.layout.db)
    for ask, table in zip(asks, ("trees", "blobs"), strict=True):
        plan = " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {ask}"))
        assert f"SEARCH {table} USING COVERING INDEX {table}_state" in plan, (ask, plan)
    conn.close()


def test_newer_schema_refused(store_root):
    Store.open(store_root).close()
    conn = sqlite3.connect(store_root / "v1" / "index.sqlite3")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaError, match="newer"):
        Store.open(store_root)
    # the owner lock was released on failure
    with pytest.raises(SchemaError):
        Store.open(store_root)


def test_second_owner_gets_typed_error_with_pid(store, store_root):
    code = (
        "import sys; sys.path.insert(0, '.')\n"
        "from kerneld.store import Store, StoreLockedError\n"
        "try:\n"
        f"    Store.open({str(store_root)!r})\n"
        "except StoreLockedError as e:\n"
        "    print('LOCKED', e.pid)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"LOCKED {os.getpid()}"
    # in-process, too (flock is per open file description)
    with pytest.raises(StoreLockedError) as info:
        Store.open(store_root)
    assert info.value.pid == os.getpid()
    assert str(os.getpid()) in str(info.value)


def test_read_only_open_needs_no_lock_and_refuses_mutation(store, store_root):
    publish(store)
    store.names.set_ref(REPO, "v1", COMMIT_A)
    ro = Store.open(store_root, read_only=True)
    try:
        hit = ro.catalog.lookup(REPO, "v1", "torch-cpu")
        assert hit is not None
        assert ro.repair.verify().clean
        with pytest.raises(ReadOnlyStoreError):
            ro.names.set_ref(REPO, "v1", COMMIT_B)
        with pytest.raises(ReadOnlyStoreError):
            ro.gc.collect()
        with pytest.raises(ReadOnlyStoreError):
            ro.repair.verify(repair=True)
        assert ro.gc.collect(dry_run=True).bytes_freed == 0
    finally:
        ro.close()


def test_read_only_open_of_missing_store(tmp_path):
    with pytest.raises(SchemaError):
        Store.open(tmp_path / "nothing", read_only=True)


def test_refs_and_lookup(store):
    publish(store)
    assert store.catalog.lookup(REPO, "v1", "torch-cpu") is None  # unknown ref
    store.names.set_ref(REPO, "v1", COMMIT_A, fetched_at=123.0)
    hit = store.catalog.lookup(REPO, "v1", "torch-cpu")
    assert hit.commit == COMMIT_A and hit.metadata_id == "_activation_0123abc"
    assert hit.archs == ["8.0", "9.0a"]
    assert store.names.get_ref(REPO, "v1").fetched_at == 123.0
    assert store.catalog.lookup(REPO, COMMIT_A, "torch-cpu").digest == hit.digest
    assert store.catalog.lookup(REPO, COMMIT_A, "torch-cuda") is None
    assert store.catalog.lookup(REPO, COMMIT_B, "torch-cpu") is None
    assert store.catalog.variants(REPO, COMMIT_A) == ["torch-cpu"]


def test_lookup_records_resolve_time(store):
    info = publish(store)
    hexd = info.digest.removeprefix("sha256:")
    before = store.index.get_tree(hexd).last_resolved
    time.sleep(1.1)
    store.catalog.lookup(REPO, COMMIT_A, "torch-cpu")
    assert store.index.get_tree(hexd).last_resolved > before


def test_denies(store):
    publish(store)
    store.names.set_ref(REPO, "v1", COMMIT_A)
    store.names.deny(REPO, COMMIT_A, reason="CVE-1234")
    with pytest.raises(DeniedError, match="CVE-1234"):
        store.catalog.lookup(REPO, "v1", "torch-cpu")
    with pytest.raises(DeniedError):
        publish(store, variant="torch-cuda")
    assert store.names.allow(REPO, COMMIT_A)
    assert store.catalog.lookup(REPO, "v1", "torch-cpu") is not None
    store.names.deny(REPO, reason="whole repo")
    with pytest.raises(DeniedError):
        store.catalog.lookup(REPO, "main", "torch-cpu")
    denies = json.loads((store.layout.published_index / "denies.json").read_text())
    assert denies["denies"] == [
        {
            "repo": REPO,
            "revision": "*",
            "reason": "whole repo",
            "created_at": pytest.approx(time.time(), abs=60),
        }
    ]


def test_a_deny_or_pin_names_the_repo_in_any_case(store):
    """The Hub resolves `Org/Name` to `org/name`: a deny refuses every spelling (in the store,
    in each spelling's published document and in denies.json's reading), one row per repo
    whatever its case, and a pin keeps every spelling's trees."""
    upper = REPO.upper()
    publish(store, repo=upper)
    store.names.set_ref(upper, "v1", COMMIT_A)
    store.names.deny(REPO, reason="advisory")
    for repo in (REPO, upper, "Kernels-Community/Activation"):
        with pytest.raises(DeniedError, match="advisory"):
            store.names.check_denied(repo, "v1")
    with pytest.raises(DeniedError):
        store.catalog.lookup(upper, "v1", "torch-cpu")
    with pytest.raises(published_index.Denied, match="advisory"):
        published_index.lookup(store.root, upper, "v1", "torch-cpu")
    store.names.deny(upper, reason="again")  # the same repo: its row is replaced
    assert [(d.repo, d.reason) for d in store.names.denies(REPO)] == [(upper, "again")]
    assert store.names.allow("kernels-community/ACTIVATION")
    assert store.names.denies() == [] and store.catalog.lookup(upper, "v1", "torch-cpu") is not None
    store.names.pin(REPO, COMMIT_A)
    (tree,) = {v.tree for v in store.catalog.variants_of(upper)}
    held = pinned_trees(store.names.pins(), store.names.all_refs(), store.index.all_variants())
    assert held == {tree: f"pinned ({REPO}@{COMMIT_A}/*)"}


def test_deny_rows_of_an_older_kerneld_keep_their_meaning(store_root):
    """An older kerneld stored `deny org/x@<rev>` as typed: a ref name still refuses the
    requests that name it, and a commit prefix now refuses every commit it abbreviates (it
    matched only a request that spelled it), in the store and in the published index it
    rebuilds at open. A new prefix row is refused: resolve it first."""
    with Store.open(store_root) as store:
        publish(store)
        store.names.set_ref(REPO, "v1", COMMIT_A)
        store.names.set_ref(REPO, "main", COMMIT_A)
        with store.index.tx() as conn:  # the row as an older kerneld wrote it
            store.index.put_deny(conn, REPO, COMMIT_A[:8], "old prefix")
    with Store.open(store_root) as store:
        for revision in ("main", "v1", COMMIT_A):
            with pytest.raises(DeniedError, match="old prefix"):
                store.catalog.lookup(REPO, revision, "torch-cpu")
            with pytest.raises(published_index.Denied, match="old prefix"):
                published_index.lookup(store.root, REPO, revision, "torch-cpu")
        assert store.names.allow(REPO, COMMIT_A[:8])
        with pytest.raises(UnresolvedDenyError, match="full commit"):
            store.names.deny(REPO, COMMIT_A[:8])
        store.names.deny(REPO, "v1", reason="old ref")  # a ref name: the requests that name it
        with pytest.raises(DeniedError, match="old ref"):
            store.catalog.lookup(REPO, "v1", "torch-cpu")
        assert store.catalog.lookup(REPO, "main", "torch-cpu") is not None


def test_leases(store):
    info = publish(store)
    lease = store.leases.acquire(info.digest, 60, holder="pid 1")
    assert lease.expires_at > time.time()
    renewed = store.leases.renew(lease.id, 120)
    assert renewed.expires_at > lease.expires_at
    assert store.leases.release(lease.id)
    with pytest.raises(LeaseNotFoundError):
        store.leases.renew(lease.id, 10)
    with pytest.raises(TreeNotFoundError):
        store.leases.acquire("sha256:" + "0" * 64, 10)
    hit = store.catalog.lookup(REPO, COMMIT_A, "torch-cpu", lease_ttl_s=30, holder="x")
    assert hit.lease is not None and hit.lease.tree == info.digest


def test_negative_cache(store):
    store.names.put_negative(REPO, "v9", "*", "RevisionNotFound", ttl_s=60)
    row = store.names.get_negative(REPO, "v9")
    assert row is not None and row.reason == "RevisionNotFound"
    store.names.put_negative(REPO, "v8", "*", "RevisionNotFound", ttl_s=-1)
    assert store.names.get_negative(REPO, "v8") is None
    publish(store)  # a successful publish clears the repo's negative entries
    assert store.names.get_negative(REPO, "v9") is None


def test_pins_roundtrip(store):
    store.names.pin(REPO, "v1")
    assert [(p.repo, p.revision, p.variant) for p in store.names.pins()] == [(REPO, "v1", "*")]
    assert store.names.unpin(REPO, "v1")
    assert not store.names.unpin(REPO, "v1")


def test_published_index_document(store):
    publish(store)
    store.names.set_ref(REPO, "v1", COMMIT_A)
    store.names.set_upstream_variants(REPO, COMMIT_A, ["torch-cpu", "torch-cuda"])
    path = store.layout.repo_index_path(REPO)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    doc = json.loads(path.read_text())
    assert doc["format"] == "kerneld-client-index" and doc["version"] == 1
    assert doc["refs"]["v1"]["commit"] == COMMIT_A
    entry = doc["commits"][COMMIT_A]
    assert entry["upstream_variants"] == ["torch-cpu", "torch-cuda"]
    v = entry["variants"]["torch-cpu"]
    assert (store.layout.root / v["tree"]).is_dir()
    assert (store.layout.root / v["lock"]).is_file()
    assert v["digest"].startswith("sha256:") and v["metadata_id"] == "_activation_0123abc"
    assert not os.path.isabs(v["tree"])
    gen = doc["generation"]
    store.names.set_ref(REPO, "main", COMMIT_A)
    assert json.loads(path.read_text())["generation"] > gen
    leftovers = [p for p in path.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_client_lookup_is_fast_and_honours_denies(store):
    publish(store)
    store.names.set_ref(REPO, "v1", COMMIT_A)
    root = store.layout.root
    hit = published_index.lookup(root, REPO, "v1", "torch-cpu")
    assert hit is not None and hit.tree.is_dir() and hit.commit == COMMIT_A
    assert published_index.lookup(root, REPO, "v2", "torch-cpu") is None
    assert published_index.lookup(root, "no/such", "v1", "torch-cpu") is None
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        published_index.lookup(root, REPO, "v1", "torch-cpu")
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 1e-3, f"{per_call * 1e6:.0f} µs per lookup"
    store.names.deny(REPO, "v1", reason="bad build")
    with pytest.raises(published_index.Denied):
        published_index.lookup(root, REPO, "v1", "torch-cpu")


def test_client_index_rebuilt_at_open(store_root):
    with Store.open(store_root) as s:
        publish(s)
        s.names.set_ref(REPO, "v1", COMMIT_A)
        path = s.layout.repo_index_path(REPO)
    path.unlink()
    (path.parent.parent / "ghost").mkdir()
    (path.parent.parent / "ghost" / "repo.json").write_text("{}")
    (path.parent / ".activation.json.1.abcd.tmp").write_text("partial")
    with Store.open(store_root) as s:
        assert json.loads(path.read_text())["refs"]["v1"]["commit"] == COMMIT_A
        assert not (path.parent.parent / "ghost" / "repo.json").exists()
        assert not (path.parent / ".activation.json.1.abcd.tmp").exists()


def test_reopen_rewrites_only_client_index_files_that_differ(store_root):
    """A restart leaves correct index files alone (no write, no fsync) and repairs the rest."""
    with Store.open(store_root) as s:
        publish(s)
        s.names.set_ref(REPO, "v1", COMMIT_A)
        path = s.layout.repo_index_path(REPO)
        denies = s.layout.published_index / "denies.json"
    before = {p: p.stat().st_ino for p in (path, denies)}
    with Store.open(store_root):
        pass
    assert {p: p.stat().st_ino for p in (path, denies)} == before  # untouched

    doc = json.loads(path.read_text())
    doc["refs"]["v1"]["commit"] = COMMIT_B  # stale or tampered content
    path.chmod(0o644)
    path.write_text(json.dumps(doc))
    denies.chmod(0o666)  # right content, unsafe mode
    with Store.open(store_root):
        pass
    assert json.loads(path.read_text())["refs"]["v1"]["commit"] == COMMIT_A
    assert stat.S_IMODE(denies.stat().st_mode) == 0o644
    assert denies.stat().st_ino != before[denies]
