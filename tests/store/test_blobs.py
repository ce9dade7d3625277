"""Blob ingest: hashing in one pass, digest/size checks, dedupe, resume, cleanup."""

from __future__ import annotations

import os
import stat
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld.store import (
    DigestMismatchError,
    Expected,
    IngestInProgressError,
    InvalidInputError,
    SizeMismatchError,
    Store,
)
from kerneld.store import blobs as blobs_mod

from .conftest import git_sha1, sha256


def test_ingest_sha256(store):
    data = b"hello kernels" * 1000
    info = store.blobs.ingest(data, size=len(data), sha256=sha256(data))
    assert info.created and info.sha256 == sha256(data)
    path = store.layout.blob_path(info.sha256)
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert store.blobs.has_blob(info.sha256)
    assert list(store.layout.ingest.iterdir()) == []


def test_ingest_git_sha1_computes_both(store):
    data = b"plain git file\n"
    info = store.blobs.ingest(data, size=len(data), git_sha1=git_sha1(data))
    assert info.sha256 == sha256(data)
    assert info.git_sha1 == git_sha1(data)
    assert store.blobs.find_blob(git_sha1=git_sha1(data)) is not None


def test_ingest_both_digests(store):
    data = os.urandom(5000)
    info = store.blobs.ingest(data, size=len(data), sha256=sha256(data), git_sha1=git_sha1(data))
    assert info.git_sha1 == git_sha1(data)


def test_dedupe_is_success_and_reads_nothing(store):
    data = b"same bytes"
    first = store.blobs.ingest(data, size=len(data), sha256=sha256(data))

    def never():
        raise AssertionError("the source must not be read for a present blob")
        yield b""

    second = store.blobs.ingest(never(), size=len(data), sha256=sha256(data))
    assert first.created and not second.created
    # A writer that completes anyway is also fine (concurrent download race).
    with store.blobs.open_writer(Expected(len(data), sha256=sha256(data))) as w:
        w.write(data)
        third = w.commit()
    assert not third.created
    assert len(store.index.blobs()) == 1


def test_empty_blob(store):
    info = store.blobs.ingest(b"", size=0, sha256=sha256(b""))
    assert info.size == 0 and store.blobs.has_blob(sha256(b""))


def test_digest_mismatch_discards(store):
    data = b"tampered"
    with pytest.raises(DigestMismatchError) as info:
        store.blobs.ingest(data, size=len(data), sha256=sha256(b"original"))
    assert info.value.expected == sha256(b"original")
    assert list(store.layout.ingest.iterdir()) == []
    assert not store.blobs.has_blob(sha256(data))


def test_git_sha1_mismatch(store):
    with pytest.raises(DigestMismatchError, match="git blob sha1"):
        store.blobs.ingest(b"abc", size=3, git_sha1=git_sha1(b"abd"))


def test_size_lies_longer(store):
    data = b"x" * 100
    w = store.blobs.open_writer(Expected(50, sha256=sha256(data[:50])))
    with pytest.raises(SizeMismatchError):
        w.write(data)
    assert list(store.layout.ingest.iterdir()) == []


def test_size_lies_shorter(store):
    data = b"x" * 100
    with pytest.raises(SizeMismatchError):
        store.blobs.ingest(data, size=200, sha256=sha256(data))
    assert list(store.layout.ingest.iterdir()) == []


def test_expected_requires_digest():
    with pytest.raises(InvalidInputError):
        Expected(10)
    with pytest.raises(InvalidInputError):
        Expected(10, sha256="nothex")
    with pytest.raises(InvalidInputError):
        Expected(-1, sha256="0" * 64)


def test_resume_after_interruption(store):
    data = os.urandom(300_000)
    exp = Expected(len(data), sha256=sha256(data))
    w = store.blobs.open_writer(exp)
    w.write(data[:123_456])
    w.close()  # connection dropped: keep the partial
    w2 = store.blobs.open_writer(exp)
    assert w2.offset == 123_456
    w2.write(data[w2.offset :])
    info = w2.commit()
    assert info.created and store.layout.blob_path(info.sha256).read_bytes() == data


def test_resume_across_reopen(store_root):
    data = os.urandom(100_000)
    exp = Expected(len(data), sha256=sha256(data))
    with Store.open(store_root) as s:
        w = s.blobs.open_writer(exp)
        w.write(data[:40_000])
        w.close()
    with Store.open(store_root) as s:
        info = s.blobs.ingest(data, size=len(data), sha256=sha256(data))  # skips the first 40000
        assert info.created
        assert s.layout.blob_path(info.sha256).read_bytes() == data


def test_partial_longer_than_expected_restarts(store):
    data = b"abc" * 10
    exp = Expected(len(data), sha256=sha256(data))
    store.layout.partial_path(*exp.key).write_bytes(b"z" * 100)
    w = store.blobs.open_writer(exp)
    assert w.offset == 0
    w.write(data)
    w.commit()


def test_concurrent_writer_refused(store):
    data = b"abc"
    exp = Expected(len(data), sha256=sha256(data))
    w = store.blobs.open_writer(exp)
    with pytest.raises(IngestInProgressError):
        store.blobs.open_writer(exp)
    w.abort()
    assert store.space.usage().bytes_reserved == 0


def test_stale_partials_removed_after_grace(store_root):
    with Store.open(store_root) as s:
        part = s.layout.ingest / ("sha256-" + "0" * 64 + ".part")
        part.write_bytes(b"x")
        old = time.time() - 100_000
        os.utime(part, (old, old))
        fresh = s.layout.ingest / "sha256-fresh.part"
        fresh.write_bytes(b"y")
    with Store.open(store_root) as s:
        assert not part.exists()
        assert fresh.exists()


def test_threaded_writer_large_blob(store, monkeypatch):
    monkeypatch.setattr(blobs_mod, "THREADED_MIN_SIZE", 1 << 16)
    monkeypatch.setattr(blobs_mod, "SYNC_EVERY", 1 << 17)
    data = os.urandom(1 << 20)
    chunks = [data[i : i + 10_000] for i in range(0, len(data), 10_000)]
    info = store.blobs.ingest(iter(chunks), size=len(data), sha256=sha256(data))
    assert store.layout.blob_path(info.sha256).read_bytes() == data


def test_writer_accepts_mutable_buffers(store):
    data = bytearray(b"q" * 1000)
    with store.blobs.open_writer(Expected(len(data), sha256=sha256(bytes(data)))) as w:
        w.write(data[:500])
        w.write(memoryview(data)[500:])
        w.commit()


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    s = Store.open(tmp_path_factory.mktemp("shared") / "s")
    yield s
    s.close()


@given(data=st.binary(max_size=5000), cuts=st.lists(st.integers(1, 700), max_size=20))
@settings(max_examples=60, deadline=None)
def test_any_chunking_gives_the_same_blob(shared_store, data, cuts):
    s = shared_store
    if True:
        chunks, i = [], 0
        for c in cuts:
            chunks.append(data[i : i + c])
            i += c
        chunks.append(data[i:])
        info = s.blobs.ingest(
            iter(chunks), size=len(data), sha256=sha256(data), git_sha1=git_sha1(data)
        )
        assert info.sha256 == sha256(data) and info.git_sha1 == git_sha1(data)
