"""Hostile tar bundles cost their documents, not their members (issue 20 §1.6), tar reading is
safe without tarfile's extraction filters (Pythons before 3.10.12 / 3.11.4, Debian 12's 3.11.2),
and a signed refs file without an export time cannot roll a ref back (issue 20 §1.7)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.mirror.bundle import (
    HAS_DATA_FILTER,
    MAX_DOCUMENTS,
    MAX_UNLISTED,
    BundleError,
    open_bundle,
)
from kerneld.mirror.documents import INFO, info_json, refs_json, refs_path
from kerneld.mirror.export import export_mirror
from kerneld.mirror.import_ import MirrorImportRefused, import_mirror
from kerneld.mirror.keys import SigningKey, generate_key, make_signature_file, sig_path
from kerneld.mirror.selection import ExportSpec
from kerneld.store import Store
from tests.ctl.test_mirror_sync import CJ, CK2, J, assert_nothing_imported, trust
from tests.support.ctl import publish, variant_files

FILTER_MODES = [
    pytest.param(False, id="own-checks-only"),
    pytest.param(
        True,
        id="with-tarfile-filter",
        marks=pytest.mark.skipif(not HAS_DATA_FILTER, reason="this Python has no tar filters"),
    ),
]
HOSTILE = 300_000


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "src")
    publish(store, J, CJ, "torch-cpu", variant_files("_j_1", {"j.py": b"J = 2\n"}), refs=("v2",))
    yield store
    store.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "dst")
    yield store
    store.close()


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return generate_key("site-1", tmp_path / "keys")


def _headers(names: list[str], size: int = 0) -> bytes:
    """ustar headers of empty regular files, built by patching one template (fast enough for
    300,000 members; tarfile's own tobuf takes seconds)."""
    tmpl = bytearray(tarfile.TarInfo("x").tobuf(tarfile.USTAR_FORMAT))
    tmpl[124:136] = b"%011o\0" % size
    out = []
    for name in names:
        h = bytearray(tmpl)
        h[0:100] = name.encode().ljust(100, b"\0")
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\0 " % sum(h)
        out.append(bytes(h))
    return b"".join(out)


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(tarfile.PAX_FORMAT) + data + bytes(-len(data) % 512)


def _good_members(good: Path) -> bytes:
    """The members of a real export, without its end-of-archive blocks."""
    with tarfile.open(good) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    return good.read_bytes()[:end]


@pytest.fixture(scope="module")
def junk_blobs() -> bytes:
    return _headers([f"blobs/sha256/00/{i:064x}" for i in range(HOSTILE)])


def _refused_fast(
    path: Path,
    target: Store,
    keys: dict[str, str],
    match: str,
    *,
    no_check_sigs: bool = False,
    memory: bool = False,
) -> None:
    """Refused within seconds (and, with `memory`, within 64 MiB of Python allocations:
    tracemalloc slows the scan, so time and memory are measured in separate runs)."""
    started = time.monotonic()
    with pytest.raises(MirrorImportRefused, match=match):
        import_mirror(target, path, keys, no_check_sigs=no_check_sigs)
    elapsed = time.monotonic() - started
    # Before: 287 MB and 33 s for 300,000 members. Now only the documents are read.
    assert elapsed < 10, f"{elapsed:.1f} s to refuse"
    if memory:
        tracemalloc.start()
        try:
            with pytest.raises(MirrorImportRefused, match=match):
                import_mirror(target, path, keys, no_check_sigs=no_check_sigs)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, f"{peak >> 20} MiB to refuse"
    assert_nothing_imported(target)


def test_a_bundle_of_300000_junk_members_is_refused_at_its_documents(
    tmp_path: Path, target: Store, key: SigningKey, junk_blobs: bytes
) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(gzip.compress(_member(INFO, info_json()) + junk_blobs + bytes(1024), 6))
    assert bomb.stat().st_size < 4 << 20  # the bomb was 2.8 MB
    _refused_fast(bomb, target, trust(key), "contains no manifests", memory=True)
    _refused_fast(bomb, target, {}, "contains no manifests", no_check_sigs=True)


def test_a_forged_bundle_is_refused_before_its_blobs_are_scanned(
    tmp_path: Path, source: Store, target: Store, key: SigningKey, junk_blobs: bytes
) -> None:
    good = tmp_path / "good.tar"
    export_mirror(source, good, [ExportSpec(J)], sign_keys=[key])
    bomb = tmp_path / "forged.tar.gz"
    bomb.write_bytes(gzip.compress(_good_members(good) + junk_blobs + bytes(1024), 1))
    other = generate_key("site-2", tmp_path / "other-keys")
    _refused_fast(bomb, target, trust(other), "signature")
    # Validly signed, but 300,000 members that no manifest names: refused at the bound.
    _refused_fast(bomb, target, trust(key), f"more than {MAX_UNLISTED} members", memory=True)


def test_documents_are_bounded_and_come_first(tmp_path: Path, target: Store) -> None:
    docs = _headers([f"refs/org/r{i}.json" for i in range(MAX_DOCUMENTS + 1)])
    many = tmp_path / "docs.tar.gz"
    many.write_bytes(gzip.compress(_member(INFO, info_json()) + docs + bytes(1024), 6))
    _refused_fast(many, target, {}, f"more than {MAX_DOCUMENTS} documents", no_check_sigs=True)

    late = tmp_path / "late.tar"
    late.write_bytes(
        _member(INFO, info_json())
        + _member("blobs/sha256/00/" + "0" * 64, b"")
        + _member("manifests/org/x/" + "a" * 40 + ".json", b"{}")
        + bytes(1024)
    )
    with pytest.raises(BundleError, match="comes after the blobs"):
        open_bundle(late)


def test_a_huge_pax_header_is_refused_without_reading_it(tmp_path: Path, target: Store) -> None:
    """tarfile reads a pax header whole, whatever size it declares (1 GiB gzips to a megabyte);
    64 MiB is over the limit and quick to build."""
    size = 64 << 20
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = size
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz:
        gz.write(_member(INFO, info_json()) + header.tobuf(tarfile.USTAR_FORMAT))
        zeros = bytes(16 << 20)
        for _ in range(size // len(zeros)):
            gz.write(zeros)
        gz.write(bytes(1024))
    bomb = tmp_path / "pax.tar.gz"
    bomb.write_bytes(raw.getvalue())
    _refused_fast(bomb, target, {}, "at once", no_check_sigs=True)


@pytest.mark.parametrize("use_filter", FILTER_MODES)
@pytest.mark.parametrize(
    ("kind", "name", "link", "message"),
    [
        (tarfile.REGTYPE, "../evil.txt", "", "path traversal"),
        (tarfile.REGTYPE, "/etc/evil", "", "absolute path"),
        (tarfile.SYMTYPE, "blobs/sha256/aa/l", "/etc/passwd", "links are not"),
        (tarfile.SYMTYPE, "blobs/sha256/aa/l", "../../../../etc", "links are not"),
        (tarfile.LNKTYPE, "blobs/sha256/aa/h", "mirror-info", "links are not"),
        (tarfile.CHRTYPE, "blobs/dev", "", "not a regular file"),
        (tarfile.BLKTYPE, "blobs/disk", "", "not a regular file"),
        (tarfile.FIFOTYPE, "blobs/fifo", "", "not a regular file"),
    ],
)
def test_hostile_members_refused_with_and_without_tarfile_filters(
    tmp_path: Path, use_filter: bool, kind: bytes, name: str, link: str, message: str
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    evil = tmp_path / "evil.tar"
    evil.write_bytes(_member(INFO, info_json()) + info.tobuf(tarfile.PAX_FORMAT) + bytes(1024))
    with pytest.raises(BundleError, match=message):
        open_bundle(evil, use_filter=use_filter)


@pytest.mark.parametrize("use_filter", FILTER_MODES)
def test_a_good_tar_reads_the_same_with_and_without_filters(
    tmp_path: Path, source: Store, key: SigningKey, use_filter: bool
) -> None:
    good = tmp_path / "good.tar.gz"
    plain = tmp_path / "good.tar"
    export_mirror(source, plain, [ExportSpec(J)], sign_keys=[key])
    good.write_bytes(gzip.compress(plain.read_bytes()))
    with open_bundle(good, use_filter=use_filter) as bundle, open_bundle(plain) as ref:
        assert sorted(bundle.files) == sorted(ref.files)
        for rel in bundle.files:
            with bundle.open_blob(rel) as a, ref.open_blob(rel) as b:
                assert a.read() == b.read()


def test_a_signed_refs_file_without_export_time_cannot_roll_a_ref_back(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    """Issue 20 §1.7: the import treated a missing `exported_at` as "now"."""
    dest = tmp_path / "m"
    export_mirror(source, dest, [ExportSpec(J)], sign_keys=[key])
    publish(target, J, CK2, "torch-cpu", variant_files("_j_2"))
    target.names.set_ref(
        J, "v2", CK2, fetched_at=time.time() - 60
    )  # newer than CJ, but older than now
    rel = refs_path(J)
    old = refs_json(J, {"v2": CJ}, {})  # validly signed, no exported_at
    assert "exported_at" not in json.loads(old)
    (dest / rel).write_bytes(old)
    (dest / sig_path(rel)).write_bytes(make_signature_file(rel, old, [key]))
    with pytest.raises(MirrorImportRefused, match="no 'exported_at' time"):
        import_mirror(target, dest, trust(key))
    assert target.names.resolve_revision(J, "v2") == CK2
    assert target.catalog.variants(J, CJ) == []  # refused before anything was imported

    # Re-exporting into that mirror stamps the refs again, and the import works.
    export_mirror(source, dest, [ExportSpec(J)], sign_keys=[key])
    assert "exported_at" in json.loads((dest / rel).read_bytes())
    assert import_mirror(target, dest, trust(key)).ok
