"""What any kerneld store must do, written against the store's protocols only (containerd's
content `testsuite`): blobs committed against their digest, content-addressed trees, names,
leases, collection, persistence.

A store implementation subclasses `StoreConformance` and says how to open one
(`open_store`); `tests/store/test_conformance.py` runs it for `kerneld.store.Store`. Each test
names the narrowest protocol it exercises (`Ingester`, `BlobProvider`, `TreePublisher`,
`Policy`, `Leases`, `Maintenance`), so a second implementation (a store on another file system
layout, a remote one) can be held to the same contract without any of `Store`'s internals.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneld.store import (
    BlobProvider,
    DeniedError,
    DigestMismatchError,
    DuplicatePathError,
    Expected,
    Ingester,
    InvalidInputError,
    LeaseNotFoundError,
    Leases,
    Maintenance,
    Policy,
    ReadOnlyStoreError,
    SizeMismatchError,
    StoreError,
    TreeFile,
    TreePublisher,
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


class StoreConformance:
    """The contract. Subclasses implement `open_store`; the rest is shared."""

    def open_store(self, root: Path, *, read_only: bool = False) -> Any:
        """A store at `root` that collects unreferenced content at once (no grace periods)."""
        raise NotImplementedError

    @pytest.fixture
    def root(self, tmp_path: Path) -> Path:
        return tmp_path / "store"

    @pytest.fixture
    def store(self, root: Path) -> Iterator[Any]:
        store = self.open_store(root)
        try:
            yield store
        finally:
            store.close()

    # -- helpers, through the protocols ------------------------------------------------------

    @staticmethod
    def ingest_all(ingester: Ingester, files: dict[str, bytes]) -> list[TreeFile]:
        out = []
        for path, data in files.items():
            info = ingester.ingest(data, size=len(data), sha256=sha256(data))
            out.append(TreeFile(path, info.sha256, len(data), upstream_id=info.sha256))
        return out

    def publish(
        self, store: Any, commit: str = COMMIT, files: dict[str, bytes] = FILES
    ) -> tuple[str, Path]:
        ingester: Ingester = store
        publisher: TreePublisher = store
        publisher.publish_tree(REPO, commit, VARIANT, self.ingest_all(ingester, files))
        hit = publisher.lookup(REPO, commit, VARIANT)
        assert hit is not None
        return hit.digest, hit.path

    # -- Ingester and BlobProvider ------------------------------------------------------------

    def test_a_blob_is_committed_against_its_digest_and_read_back(self, store: Any) -> None:
        ingester: Ingester = store
        provider: BlobProvider = store
        data = b"kernel bytes " * 1000
        info = ingester.ingest(data, size=len(data), sha256=sha256(data), git_sha1=git_sha1(data))
        assert info.sha256 == sha256(data)
        assert provider.has_blob(sha256(data))
        with provider.open_blob(sha256(data)) as f:
            assert f.read() == data
        by_git = ingester.find_blob(git_sha1=git_sha1(data))
        assert by_git is not None and by_git.sha256 == sha256(data)

    def test_a_blob_whose_bytes_differ_from_its_digest_is_refused_and_leaves_nothing(
        self, store: Any
    ) -> None:
        ingester: Ingester = store
        provider: BlobProvider = store
        data, claimed = b"what arrived", sha256(b"what was announced")
        with pytest.raises(DigestMismatchError):
            ingester.ingest(data, size=len(data), sha256=claimed)
        assert not provider.has_blob(claimed) and not provider.has_blob(sha256(data))
        assert ingester.find_blob(sha256=claimed) is None

    def test_a_blob_of_another_size_is_refused(self, store: Any) -> None:
        ingester: Ingester = store
        data = b"twelve bytes"
        with pytest.raises(SizeMismatchError):
            ingester.ingest(data, size=len(data) + 1, sha256=sha256(data))
        assert ingester.find_blob(sha256=sha256(data)) is None

    def test_ingesting_the_same_bytes_twice_keeps_one_blob(self, store: Any) -> None:
        ingester: Ingester = store
        data = b"same"
        first = ingester.ingest(data, size=len(data), sha256=sha256(data))
        second = ingester.ingest(io.BytesIO(data), size=len(data), git_sha1=git_sha1(data))
        assert first.sha256 == second.sha256 == sha256(data)

    def test_a_streamed_blob_commits_only_when_complete_and_right(self, store: Any) -> None:
        ingester: Ingester = store
        provider: BlobProvider = store
        data = bytes(range(256)) * 64
        writer = ingester.open_writer(Expected(size=len(data), sha256=sha256(data)))
        for i in range(0, len(data), 1000):
            writer.write(data[i : i + 1000])
        assert not provider.has_blob(sha256(data))  # not before the commit
        writer.commit()
        assert provider.has_blob(sha256(data))
        bad = b"x" * 100
        writer = ingester.open_writer(Expected(size=len(bad), sha256=sha256(b"y" * 100)))
        writer.write(bad)
        with pytest.raises(DigestMismatchError):
            writer.commit()
        assert not provider.has_blob(sha256(b"y" * 100))

    def test_a_missing_blob_cannot_be_opened(self, store: Any) -> None:
        provider: BlobProvider = store
        assert not provider.has_blob("0" * 64)
        with pytest.raises(FileNotFoundError):
            provider.open_blob("0" * 64)

    # -- TreePublisher --------------------------------------------------------------------------

    def test_a_published_tree_holds_exactly_its_files_read_only(self, store: Any) -> None:
        _, path = self.publish(store)
        found = {
            str(p.relative_to(path)): p.read_bytes()
            for p in path.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        assert found == FILES
        assert all(not p.stat().st_mode & 0o222 for p in path.rglob("*") if p.is_file())

    def test_trees_are_content_addressed(self, store: Any) -> None:
        digest, _ = self.publish(store)
        again, _ = self.publish(store, commit=OTHER_COMMIT)
        assert again == digest  # same files under another commit: one tree
        changed, _ = self.publish(store, files=with_metadata({**CODE, "_ops.py": b"ops = 2\n"}))
        assert changed != digest

    def test_a_variant_without_metadata_or_with_a_wrong_digest_is_refused(self, store: Any) -> None:
        ingester: Ingester = store
        publisher: TreePublisher = store
        with pytest.raises(StoreError, match="metadata.json"):
            publisher.publish_tree(REPO, COMMIT, VARIANT, self.ingest_all(ingester, CODE))
        lying = {**with_metadata(CODE), "_ops.py": b"ops = 'swapped after signing'\n"}
        with pytest.raises(StoreError):
            publisher.publish_tree(REPO, COMMIT, VARIANT, self.ingest_all(ingester, lying))
        assert publisher.lookup(REPO, COMMIT, VARIANT) is None

    def test_a_tree_of_blobs_never_ingested_is_refused(self, store: Any) -> None:
        publisher: TreePublisher = store
        with pytest.raises(StoreError):
            publisher.publish_tree(REPO, COMMIT, VARIANT, [TreeFile("a.py", "e" * 64, 3)])
        assert publisher.lookup(REPO, COMMIT, VARIANT) is None

    @pytest.mark.parametrize("path", ["../escape.py", "/abs.py", "a/../../b.py", ""])
    def test_hostile_paths_are_refused(self, store: Any, path: str) -> None:
        ingester: Ingester = store
        publisher: TreePublisher = store
        (file,) = self.ingest_all(ingester, {"x.py": b"x = 1\n"})
        with pytest.raises(InvalidInputError):
            publisher.publish_tree(REPO, COMMIT, VARIANT, [TreeFile(path, file.sha256, file.size)])
        assert publisher.lookup(REPO, COMMIT, VARIANT) is None

    def test_a_path_given_twice_is_refused(self, store: Any) -> None:
        ingester: Ingester = store
        publisher: TreePublisher = store
        (file,) = self.ingest_all(ingester, {"x.py": b"x = 1\n"})
        with pytest.raises(DuplicatePathError):
            publisher.publish_tree(REPO, COMMIT, VARIANT, [file, file])

    def test_an_unknown_kernel_is_a_miss(self, store: Any) -> None:
        publisher: TreePublisher = store
        assert publisher.lookup(REPO, COMMIT, VARIANT) is None
        self.publish(store)
        assert publisher.lookup(REPO, COMMIT, "torch-other") is None
        assert publisher.lookup("conformance/other", COMMIT, VARIANT) is None

    # -- Policy: names, listings, the negative cache, denies -----------------------------------

    def test_a_ref_names_a_commit_and_finds_its_tree(self, store: Any) -> None:
        policy: Policy = store
        publisher: TreePublisher = store
        digest, _ = self.publish(store)
        assert policy.get_ref(REPO, "v1") is None
        policy.set_ref(REPO, "v1", COMMIT, versions=[1])
        row = policy.get_ref(REPO, "v1")
        assert row is not None and row.commit == COMMIT
        hit = publisher.lookup(REPO, "v1", VARIANT)
        assert hit is not None and hit.digest == digest and hit.commit == COMMIT
        policy.set_ref(REPO, "v1", OTHER_COMMIT)
        assert publisher.lookup(REPO, "v1", VARIANT) is None  # the ref moved, no tree there yet

    def test_upstream_listings_and_the_negative_cache(self, store: Any) -> None:
        policy: Policy = store
        assert policy.upstream_variants(REPO, COMMIT) is None
        policy.set_upstream_variants(REPO, COMMIT, ["torch-cpu", "torch-cuda"])
        assert sorted(policy.upstream_variants(REPO, COMMIT) or []) == ["torch-cpu", "torch-cuda"]
        assert policy.get_negative(REPO, "main", VARIANT) is None
        policy.put_negative(REPO, "main", VARIANT, "not found upstream", 3600)
        row = policy.get_negative(REPO, "main", VARIANT)
        assert row is not None and "not found" in row.reason
        policy.put_negative(REPO, "gone", VARIANT, "expired", 0)
        assert policy.get_negative(REPO, "gone", VARIANT) is None

    def test_a_denied_kernel_is_refused_until_allowed(self, store: Any) -> None:
        policy: Policy = store
        policy.check_denied(REPO, "main")
        store.deny(REPO, reason="CVE-2026-0001")
        with pytest.raises(DeniedError, match="CVE-2026-0001"):
            policy.check_denied(REPO, "main", COMMIT)
        assert store.allow(REPO)
        policy.check_denied(REPO, "main", COMMIT)

    # -- Leases and Maintenance -----------------------------------------------------------------

    def test_leases_are_listed_renewed_and_released(self, store: Any) -> None:
        leases: Leases = store
        digest, _ = self.publish(store)
        lease = leases.acquire_lease(digest, 60.0, holder="job-1")
        assert [row.id for row in leases.leases()] == [lease.id]
        renewed = leases.renew_lease(lease.id, 120.0)
        assert renewed.expires_at >= lease.expires_at
        assert leases.release_lease(lease.id)
        assert not leases.release_lease(lease.id)
        with pytest.raises(LeaseNotFoundError):
            leases.renew_lease(lease.id, 60.0)

    def test_collection_removes_unused_blobs_and_keeps_published_trees(self, store: Any) -> None:
        maintenance: Maintenance = store
        provider: BlobProvider = store
        ingester: Ingester = store
        publisher: TreePublisher = store
        self.publish(store)
        stray = b"ingested, never published"
        ingester.ingest(stray, size=len(stray), sha256=sha256(stray))
        report = maintenance.gc()
        assert sha256(stray) in report.blobs_deleted
        assert not provider.has_blob(sha256(stray))
        assert publisher.lookup(REPO, COMMIT, VARIANT) is not None
        assert all(provider.has_blob(sha256(data)) for data in FILES.values())

    def test_a_sound_store_verifies_clean(self, store: Any) -> None:
        maintenance: Maintenance = store
        digest, _ = self.publish(store)
        report = maintenance.verify()
        assert report.problems == [], report.problems
        # Tree digests are `sha256:<hex>` where a tree is named; the listing gives the hex.
        assert digest.removeprefix("sha256:") in maintenance.live_tree_digests()

    # -- Persistence and read-only access -------------------------------------------------------

    def test_everything_survives_a_reopen_and_a_reader_cannot_write(self, root: Path) -> None:
        store = self.open_store(root)
        try:
            digest, _ = self.publish(store)
            store.set_ref(REPO, "main", COMMIT)
        finally:
            store.close()
        reader = self.open_store(root, read_only=True)
        try:
            hit = reader.lookup(REPO, "main", VARIANT)
            assert hit is not None and hit.digest == digest
            data = b"not allowed"
            with pytest.raises(ReadOnlyStoreError):
                reader.ingest(data, size=len(data), sha256=sha256(data))
        finally:
            reader.close()
