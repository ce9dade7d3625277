"""What any kerneld store must do, written against the store's protocols only (containerd's
content `testsuite`): blobs committed against their digest (resumed, and with two writers of one
digest), content-addressed trees, names, leases, collection, persistence.

Two contracts. `StoreConformance`: a store a daemon owns (`open_store` gives a `StoreHandle`).
`ReaderConformance`: a read-only handle on a store another process wrote and closed, such as
the store a container mounts read-only at another path (`open_reader`); it answers every read
the same and refuses every write. `tests/store/test_conformance.py` runs both. Each test takes
the parts it exercises as fixtures typed by their protocols (`Blobs`, `Trees`, `Policy`,
`Catalog`, `Leases`, `Collection`, `Repair`), never `Store`'s internals.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.store import (
    Blobs,
    Catalog,
    Collection,
    DeniedError,
    DigestMismatchError,
    DuplicatePathError,
    Expected,
    Ingester,
    IngestInProgressError,
    InvalidInputError,
    LeaseNotFoundError,
    Leases,
    Policy,
    ReadOnlyStoreError,
    Repair,
    SizeMismatchError,
    StoreError,
    StoreHandle,
    TreeFile,
    Trees,
)
from tests.store.conftest import git_sha1, sha256

REPO = "conformance/kernel"
COMMIT = "c" * 40
OTHER_COMMIT = "d" * 40
VARIANT = "torch-cpu"


def with_metadata(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` and the metadata.json the Kernel Hub format requires, its digest covering them."""
    digest = {p: base64.b64encode(hashlib.sha256(b).digest()).decode() for p, b in files.items()}
    doc = {
        "id": "_conformance_0123abc",
        "name": "conformance",
        "version": 1,
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": digest},
    }
    return {**files, "metadata.json": json.dumps(doc).encode()}


CODE = {
    "__init__.py": b"from ._ops import ops\n",
    "_ops.py": b"ops = 'conformance'\n",
    "lib/_kernel.abi3.so": b"\x7fELF" + bytes(range(256)) * 8,
}
FILES = with_metadata(CODE)


def ingest_all(ingester: Ingester, files: dict[str, bytes]) -> list[TreeFile]:
    out = []
    for path, data in files.items():
        info = ingester.ingest(data, size=len(data), sha256=sha256(data))
        out.append(TreeFile(path, info.sha256, len(data), upstream_id=info.sha256))
    return out


def publish(
    store: StoreHandle, commit: str = COMMIT, files: dict[str, bytes] = FILES
) -> tuple[str, Path]:
    """Ingest `files`, publish them as `VARIANT` of `commit`; the tree's digest and path."""
    store.trees.publish_tree(REPO, commit, VARIANT, ingest_all(store.blobs, files))
    hit = store.catalog.lookup(REPO, commit, VARIANT)
    assert hit is not None
    return hit.digest, hit.path


def tree_files(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in path.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


class StoreConformance:
    """The contract of a store a daemon owns. Subclasses implement `open_store`."""

    def open_store(self, root: Path, *, read_only: bool = False) -> StoreHandle:
        """A store at `root` that collects unreferenced content at once (no grace periods)."""
        raise NotImplementedError

    @pytest.fixture
    def root(self, tmp_path: Path) -> Path:
        return tmp_path / "store"

    @pytest.fixture
    def store(self, root: Path) -> Iterator[StoreHandle]:
        store = self.open_store(root)
        try:
            yield store
        finally:
            store.close()

    # The parts, each as its protocol: a test says what it exercises by the fixtures it takes.

    @pytest.fixture
    def blobs(self, store: StoreHandle) -> Blobs:
        return store.blobs

    @pytest.fixture
    def trees(self, store: StoreHandle) -> Trees:
        return store.trees

    @pytest.fixture
    def names(self, store: StoreHandle) -> Policy:
        return store.names

    @pytest.fixture
    def catalog(self, store: StoreHandle) -> Catalog:
        return store.catalog

    @pytest.fixture
    def leases(self, store: StoreHandle) -> Leases:
        return store.leases

    @pytest.fixture
    def gc(self, store: StoreHandle) -> Collection:
        return store.gc

    @pytest.fixture
    def repair(self, store: StoreHandle) -> Repair:
        return store.repair

    # -- blobs ----------------------------------------------------------------------------------

    def test_a_blob_is_committed_against_its_digest_and_read_back(self, blobs: Blobs) -> None:
        data = b"kernel bytes " * 1000
        info = blobs.ingest(data, size=len(data), sha256=sha256(data), git_sha1=git_sha1(data))
        assert info.sha256 == sha256(data)
        assert blobs.has_blob(sha256(data))
        with blobs.open_blob(sha256(data)) as f:
            assert f.read() == data
        by_git = blobs.find_blob(git_sha1=git_sha1(data))
        assert by_git is not None and by_git.sha256 == sha256(data)

    def test_a_blob_whose_bytes_differ_from_its_digest_is_refused_and_leaves_nothing(
        self, blobs: Blobs
    ) -> None:
        data, claimed = b"what arrived", sha256(b"what was announced")
        with pytest.raises(DigestMismatchError):
            blobs.ingest(data, size=len(data), sha256=claimed)
        assert not blobs.has_blob(claimed) and not blobs.has_blob(sha256(data))
        assert blobs.find_blob(sha256=claimed) is None

    def test_a_blob_of_another_size_is_refused(self, blobs: Blobs) -> None:
        data = b"twelve bytes"
        with pytest.raises(SizeMismatchError):
            blobs.ingest(data, size=len(data) + 1, sha256=sha256(data))
        assert blobs.find_blob(sha256=sha256(data)) is None

    def test_ingesting_the_same_bytes_twice_keeps_one_blob(self, blobs: Blobs) -> None:
        data = b"same"
        first = blobs.ingest(data, size=len(data), sha256=sha256(data))
        second = blobs.ingest(io.BytesIO(data), size=len(data), git_sha1=git_sha1(data))
        assert first.sha256 == second.sha256 == sha256(data)
        assert first.created and not second.created

    def test_a_streamed_blob_commits_only_when_complete_and_right(self, blobs: Blobs) -> None:
        data = bytes(range(256)) * 64
        writer = blobs.open_writer(Expected(size=len(data), sha256=sha256(data)))
        for i in range(0, len(data), 1000):
            writer.write(data[i : i + 1000])
        assert not blobs.has_blob(sha256(data))  # not before the commit
        writer.commit()
        assert blobs.has_blob(sha256(data))
        bad = b"x" * 100
        writer = blobs.open_writer(Expected(size=len(bad), sha256=sha256(b"y" * 100)))
        writer.write(bad)
        with pytest.raises(DigestMismatchError):
            writer.commit()
        assert not blobs.has_blob(sha256(b"y" * 100))

    def test_an_interrupted_ingest_resumes_where_it_stopped(self, blobs: Blobs) -> None:
        data = bytes(range(256)) * 40
        expected = Expected(size=len(data), sha256=sha256(data))
        first = blobs.open_writer(expected)
        first.write(data[:4000])
        first.close()  # interrupted: the bytes so far are kept for a resume
        assert not blobs.has_blob(sha256(data))
        second = blobs.open_writer(expected)
        assert second.offset == 4000  # where a ranged download continues
        second.write(data[4000:])
        assert second.commit().sha256 == sha256(data)
        with blobs.open_blob(sha256(data)) as f:
            assert f.read() == data

    def test_a_whole_ingest_after_an_interrupted_one_skips_what_is_there(
        self, blobs: Blobs
    ) -> None:
        data = b"resumable " * 700
        writer = blobs.open_writer(Expected(size=len(data), sha256=sha256(data)))
        writer.write(data[:1234])
        writer.close()
        info = blobs.ingest(data, size=len(data), sha256=sha256(data))
        assert info.sha256 == sha256(data) and info.created
        with blobs.open_blob(sha256(data)) as f:
            assert f.read() == data

    def test_a_resumed_ingest_of_wrong_bytes_is_refused_and_starts_over(self, blobs: Blobs) -> None:
        data = b"the real file " * 300
        expected = Expected(size=len(data), sha256=sha256(data))
        writer = blobs.open_writer(expected)
        writer.write(b"X" * 1000)  # an interrupted download of other bytes
        writer.close()
        resumed = blobs.open_writer(expected)
        resumed.write(data[resumed.offset :])
        with pytest.raises(DigestMismatchError):
            resumed.commit()
        assert not blobs.has_blob(sha256(data))
        assert blobs.ingest(data, size=len(data), sha256=sha256(data)).sha256 == sha256(data)

    def test_two_writers_of_one_digest_make_one_blob(self, blobs: Blobs) -> None:
        data = b"fetched by two jobs at once " * 200
        expected = Expected(size=len(data), sha256=sha256(data))
        first = blobs.open_writer(expected)
        first.write(data[:100])
        with pytest.raises(IngestInProgressError):
            blobs.open_writer(expected)  # the second waits for the first, it does not interleave
        first.write(data[100:])
        assert first.commit().created
        late = blobs.open_writer(expected)  # the loser of the race, after the winner committed
        late.write(data[late.offset :])
        again = late.commit()
        assert again.sha256 == sha256(data) and not again.created
        with blobs.open_blob(sha256(data)) as f:
            assert f.read() == data

    def test_two_threads_ingesting_one_digest_agree_on_one_blob(self, blobs: Blobs) -> None:
        data = bytes(range(256)) * 4096  # 1 MiB: long enough for the writes to overlap
        start = threading.Barrier(2)
        results: list[object] = []

        def ingest() -> None:
            start.wait()
            try:
                results.append(blobs.ingest(data, size=len(data), sha256=sha256(data)))
            except IngestInProgressError as exc:  # the other one was writing it
                results.append(exc)

        threads = [threading.Thread(target=ingest) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        infos = [r for r in results if not isinstance(r, Exception)]
        assert infos and all(i.sha256 == sha256(data) for i in infos)  # type: ignore[attr-defined]
        assert sum(1 for i in infos if i.created) == 1  # type: ignore[attr-defined]
        with blobs.open_blob(sha256(data)) as f:
            assert f.read() == data

    def test_a_missing_blob_cannot_be_opened(self, blobs: Blobs) -> None:
        assert not blobs.has_blob("0" * 64)
        with pytest.raises(FileNotFoundError):
            blobs.open_blob("0" * 64)

    # -- trees ----------------------------------------------------------------------------------

    def test_a_published_tree_holds_exactly_its_files_read_only(self, store: StoreHandle) -> None:
        _, path = publish(store)
        assert tree_files(path) == FILES
        assert all(not p.stat().st_mode & 0o222 for p in path.rglob("*") if p.is_file())

    def test_trees_are_content_addressed(self, store: StoreHandle) -> None:
        digest, _ = publish(store)
        again, _ = publish(store, commit=OTHER_COMMIT)
        assert again == digest  # same files under another commit: one tree
        changed, _ = publish(store, files=with_metadata({**CODE, "_ops.py": b"ops = 2\n"}))
        assert changed != digest

    def test_a_variant_without_metadata_or_with_a_wrong_digest_is_refused(
        self, blobs: Blobs, trees: Trees, catalog: Catalog
    ) -> None:
        with pytest.raises(StoreError, match="metadata.json"):
            trees.publish_tree(REPO, COMMIT, VARIANT, ingest_all(blobs, CODE))
        lying = {**with_metadata(CODE), "_ops.py": b"ops = 'swapped after signing'\n"}
        with pytest.raises(StoreError):
            trees.publish_tree(REPO, COMMIT, VARIANT, ingest_all(blobs, lying))
        assert catalog.lookup(REPO, COMMIT, VARIANT) is None

    def test_a_tree_of_blobs_never_ingested_is_refused(
        self, trees: Trees, catalog: Catalog
    ) -> None:
        with pytest.raises(StoreError):
            trees.publish_tree(REPO, COMMIT, VARIANT, [TreeFile("a.py", "e" * 64, 3)])
        assert catalog.lookup(REPO, COMMIT, VARIANT) is None

    @pytest.mark.parametrize("path", ["../escape.py", "/abs.py", "a/../../b.py", ""])
    def test_hostile_paths_are_refused(
        self, blobs: Blobs, trees: Trees, catalog: Catalog, path: str
    ) -> None:
        (file,) = ingest_all(blobs, {"x.py": b"x = 1\n"})
        with pytest.raises(InvalidInputError):
            trees.publish_tree(REPO, COMMIT, VARIANT, [TreeFile(path, file.sha256, file.size)])
        assert catalog.lookup(REPO, COMMIT, VARIANT) is None

    def test_a_path_given_twice_is_refused(self, blobs: Blobs, trees: Trees) -> None:
        (file,) = ingest_all(blobs, {"x.py": b"x = 1\n"})
        with pytest.raises(DuplicatePathError):
            trees.publish_tree(REPO, COMMIT, VARIANT, [file, file])

    def test_an_unknown_kernel_is_a_miss(self, store: StoreHandle, catalog: Catalog) -> None:
        assert catalog.lookup(REPO, COMMIT, VARIANT) is None
        publish(store)
        assert catalog.lookup(REPO, COMMIT, "torch-other") is None
        assert catalog.lookup("conformance/other", COMMIT, VARIANT) is None

    # -- names: refs, listings, the negative cache, denies ---------------------------------------

    def test_a_ref_names_a_commit_and_finds_its_tree(
        self, store: StoreHandle, names: Policy, catalog: Catalog
    ) -> None:
        digest, _ = publish(store)
        assert names.get_ref(REPO, "v1") is None
        names.set_ref(REPO, "v1", COMMIT, versions=[1])
        row = names.get_ref(REPO, "v1")
        assert row is not None and row.commit == COMMIT
        hit = catalog.lookup(REPO, "v1", VARIANT)
        assert hit is not None and hit.digest == digest and hit.commit == COMMIT
        names.set_ref(REPO, "v1", OTHER_COMMIT)
        assert catalog.lookup(REPO, "v1", VARIANT) is None  # the ref moved, no tree there yet

    def test_upstream_listings_and_the_negative_cache(self, names: Policy) -> None:
        assert names.upstream_variants(REPO, COMMIT) is None
        names.set_upstream_variants(REPO, COMMIT, ["torch-cpu", "torch-cuda"])
        assert sorted(names.upstream_variants(REPO, COMMIT) or []) == ["torch-cpu", "torch-cuda"]
        assert names.get_negative(REPO, "main", VARIANT) is None
        names.put_negative(REPO, "main", VARIANT, "not found upstream", 3600)
        row = names.get_negative(REPO, "main", VARIANT)
        assert row is not None and "not found" in row.reason
        names.put_negative(REPO, "gone", VARIANT, "expired", 0)
        assert names.get_negative(REPO, "gone", VARIANT) is None

    def test_a_denied_kernel_is_refused_until_allowed(
        self, store: StoreHandle, names: Policy, catalog: Catalog
    ) -> None:
        publish(store)
        names.check_denied(REPO, "main")
        names.deny(REPO, reason="CVE-2026-0001")
        with pytest.raises(DeniedError, match="CVE-2026-0001"):
            names.check_denied(REPO, "main", COMMIT)
        with pytest.raises(DeniedError):
            catalog.lookup(REPO, COMMIT, VARIANT)
        assert names.allow(REPO)
        names.check_denied(REPO, "main", COMMIT)
        assert catalog.lookup(REPO, COMMIT, VARIANT) is not None

    # -- leases, collection, verification --------------------------------------------------------

    def test_leases_are_listed_renewed_and_released(
        self, store: StoreHandle, leases: Leases
    ) -> None:
        digest, _ = publish(store)
        lease = leases.acquire(digest, 60.0, holder="job-1")
        assert [row.id for row in leases.rows()] == [lease.id]
        renewed = leases.renew(lease.id, 120.0)
        assert renewed.expires_at >= lease.expires_at
        assert leases.release(lease.id)
        assert not leases.release(lease.id)
        with pytest.raises(LeaseNotFoundError):
            leases.renew(lease.id, 60.0)

    def test_collection_removes_unused_blobs_and_keeps_published_trees(
        self, store: StoreHandle, blobs: Blobs, catalog: Catalog, gc: Collection
    ) -> None:
        publish(store)
        stray = b"ingested, never published"
        blobs.ingest(stray, size=len(stray), sha256=sha256(stray))
        report = gc.collect()
        assert sha256(stray) in report.blobs_deleted
        assert not blobs.has_blob(sha256(stray))
        assert catalog.lookup(REPO, COMMIT, VARIANT) is not None
        assert all(blobs.has_blob(sha256(data)) for data in FILES.values())

    def test_a_sound_store_verifies_clean(
        self, store: StoreHandle, repair: Repair, catalog: Catalog
    ) -> None:
        digest, _ = publish(store)
        report = repair.verify()
        assert report.problems == [], report.problems
        # Tree digests are `sha256:<hex>` where a tree is named; the listing gives the hex.
        assert digest.removeprefix("sha256:") in catalog.live_tree_digests()

    # -- persistence and read-only access --------------------------------------------------------

    def test_everything_survives_a_reopen_and_a_reader_cannot_write(self, root: Path) -> None:
        store = self.open_store(root)
        try:
            digest, _ = publish(store)
            store.names.set_ref(REPO, "main", COMMIT)
        finally:
            store.close()
        reader = self.open_store(root, read_only=True)
        try:
            hit = reader.catalog.lookup(REPO, "main", VARIANT)
            assert hit is not None and hit.digest == digest
            data = b"not allowed"
            with pytest.raises(ReadOnlyStoreError):
                reader.blobs.ingest(data, size=len(data), sha256=sha256(data))
        finally:
            reader.close()


#: What `ReaderConformance` publishes before a reader opens the store.
DENIED_REPO = "conformance/denied"
STRAY = b"a blob no tree names"


class ReaderConformance:
    """The contract of a read-only handle on a store another process wrote and closed (a
    stopped daemon's store, or one mounted read-only at another path). Subclasses implement
    `open_writer_store` (where the content is written) and `open_reader`."""

    def open_writer_store(self, root: Path) -> StoreHandle:
        raise NotImplementedError

    def open_reader(self, root: Path) -> StoreHandle:
        """A read-only handle on what `open_writer_store(root)` wrote."""
        raise NotImplementedError

    @pytest.fixture
    def written(self, tmp_path: Path) -> tuple[Path, str]:
        """A store with a tree under a ref, a denied repo, a stray blob; its root and the tree."""
        root = tmp_path / "store"
        store = self.open_writer_store(root)
        try:
            digest, _ = publish(store)
            store.names.set_ref(REPO, "main", COMMIT, versions=[1, 2])
            store.names.set_upstream_variants(REPO, COMMIT, [VARIANT, "torch-cuda"])
            store.names.deny(DENIED_REPO, reason="CVE-2026-0002")
            store.blobs.ingest(STRAY, size=len(STRAY), sha256=sha256(STRAY))
        finally:
            store.close()
        return root, digest

    @pytest.fixture
    def reader(self, written: tuple[Path, str]) -> Iterator[StoreHandle]:
        reader = self.open_reader(written[0])
        try:
            yield reader
        finally:
            reader.close()

    def test_a_reader_finds_the_tree_by_ref_and_by_commit(
        self, reader: StoreHandle, written: tuple[Path, str]
    ) -> None:
        catalog: Catalog = reader.catalog
        for revision in ("main", COMMIT):
            hit = catalog.lookup(REPO, revision, VARIANT)
            assert hit is not None and hit.digest == written[1] and hit.commit == COMMIT
            assert hit.path.is_relative_to(reader.root)  # where this reader sees the store
            assert tree_files(hit.path) == FILES
        assert catalog.lookup(REPO, COMMIT, "torch-other") is None
        assert catalog.variants(REPO, COMMIT) == [VARIANT]

    def test_a_reader_reads_every_blob(self, reader: StoreHandle) -> None:
        blobs: Blobs = reader.blobs
        for data in [*FILES.values(), STRAY]:
            assert blobs.has_blob(sha256(data))
            with blobs.open_blob(sha256(data)) as f:
                assert f.read() == data
        assert not blobs.has_blob(sha256(b"never ingested"))

    def test_a_reader_knows_the_names_and_refuses_what_is_denied(self, reader: StoreHandle) -> None:
        names: Policy = reader.names
        row = names.get_ref(REPO, "main")
        assert row is not None and row.commit == COMMIT
        assert names.upstream_versions(REPO) == [1, 2]
        assert sorted(names.upstream_variants(REPO, COMMIT) or []) == [VARIANT, "torch-cuda"]
        assert names.resolve_revision(REPO, "main") == COMMIT
        with pytest.raises(DeniedError, match="CVE-2026-0002"):
            names.check_denied(DENIED_REPO, "main")
        with pytest.raises(DeniedError):
            reader.catalog.lookup(DENIED_REPO, COMMIT, VARIANT)

    def test_a_reader_verifies_the_store_clean(self, reader: StoreHandle) -> None:
        repair: Repair = reader.repair
        assert repair.verify().problems == []

    def test_a_reader_changes_nothing(self, reader: StoreHandle, written: tuple[Path, str]) -> None:
        data = b"not allowed"
        with pytest.raises(ReadOnlyStoreError):
            reader.blobs.ingest(data, size=len(data), sha256=sha256(data))
        with pytest.raises(ReadOnlyStoreError):
            reader.blobs.open_writer(Expected(size=len(data), sha256=sha256(data)))
        with pytest.raises(ReadOnlyStoreError):
            reader.names.set_ref(REPO, "main", OTHER_COMMIT)
        with pytest.raises(ReadOnlyStoreError):
            reader.names.deny(REPO)
        with pytest.raises(ReadOnlyStoreError):
            reader.leases.acquire(written[1], 60.0)
        with pytest.raises(ReadOnlyStoreError):
            reader.gc.collect()
        reader.gc.collect(dry_run=True)  # planning changes nothing: allowed
        assert reader.blobs.has_blob(sha256(STRAY))
        assert reader.catalog.lookup(REPO, "main", VARIANT) is not None
