"""Mirror bundles (tar files and directories) through `import_mirror` into a real store: the
bundle is refused (MirrorImportRefused) or imported; nothing outside the store changes."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import shutil
import tarfile
from collections.abc import Callable, Iterator
from typing import Literal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import builders as b
from tests.fuzz import harnesses
from tests.fuzz import invariants as inv
from tests.fuzz.invariants import OUTSIDE
from tests.fuzz.strategies import fuzz_settings, json_document, raw_mutations


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harnesses.BundleHarness]:
    h = harnesses.BundleHarness(tmp_path_factory.mktemp("fuzz-bundle"))
    yield h
    h.close()


HOSTILE_NAMES = [
    f"{OUTSIDE}/pwned",
    "../outside/pwned",
    "../../pwned",
    "blobs/../../outside/pwned",
    "./mirror-info",
    "mirror-info/",
    "manifests//x",
    "a\\..\\b",
    "a\x00b",
    "é",
    "x" * 300,
    "refs/" + "d/" * 300 + "x.json",
    ".",
    "",
]
TAR_FORMATS: tuple[Literal[0, 1, 2], ...] = (
    tarfile.PAX_FORMAT,
    tarfile.GNU_FORMAT,
    tarfile.USTAR_FORMAT,
)
LINK_TARGETS = [f"{OUTSIDE}/canary", "../outside/canary", "mirror-info", ""]


@st.composite
def hostile_member(draw: st.DrawFn, existing: list[str]) -> b.Member:
    kind = draw(
        st.sampled_from(["file", "dir", "symlink", "hardlink", "fifo", "char", "block", "huge"])
    )
    name = draw(st.one_of(*[st.sampled_from(HOSTILE_NAMES)] * 3, st.sampled_from(existing)))
    return b.Member(
        name,
        kind,
        data=draw(st.binary(max_size=32)),
        link=draw(st.sampled_from(LINK_TARGETS + existing[:2])),
        size=draw(st.sampled_from([None, None, 2**40, 2**33, 0])),
    )


@st.composite
def bundles(draw: st.DrawFn, harness: harnesses.BundleHarness, *, signed: bool) -> list[b.Member]:
    """A valid signed mirror of one kernel, then mutated: its manifest (re-signed or not),
    blob contents, hostile or duplicate members, reordering."""
    extra = draw(
        st.dictionaries(
            st.sampled_from(["_ops.py", "lib/k.so", "a/b/c.py"]), st.binary(max_size=16), max_size=2
        )
    )
    variants = {"torch-universal": b.variant_files(extra)}
    if draw(st.booleans()):
        variants["torch213-cxx11-cpu-x86_64-linux"] = b.variant_files()
    manifest = None
    if draw(st.integers(0, 2)) == 0:
        manifest = draw(json_document(st.just(b.manifest_doc(variants))))
    files = b.mirror_files(variants, manifest=manifest, sign=harness.sign if signed else None)
    members = b.members_of(files)
    names = [m.name for m in members]
    for _ in range(draw(st.integers(0, 3))):
        op = draw(
            st.sampled_from(
                ["hostile", "hostile", "hostile", "corrupt", "drop", "dirs", "duplicate"]
            )
        )
        i = draw(st.integers(0, len(members) - 1)) if members else 0
        if op == "hostile":
            members.insert(i, draw(hostile_member(names)))
        elif op == "corrupt" and members:
            members[i] = b.Member(members[i].name, data=draw(st.binary(max_size=64)))
        elif op == "drop" and members:
            del members[i]
        elif op == "duplicate" and members:
            members.insert(i, members[i])
        elif op == "dirs":
            members.insert(0, b.Member("blobs", "dir"))
    if draw(st.booleans()):
        members = draw(st.permutations(members))
    return members


def _tar(harness: harnesses.BundleHarness, signed: bool) -> st.SearchStrategy[bytes]:
    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        members = [
            b.Member(
                harness.sandbox.hostile(m.name),
                m.kind,
                m.data,
                harness.sandbox.hostile(m.link),
                m.size,
            )
            for m in draw(bundles(harness, signed=signed))
        ]
        fmt = draw(st.sampled_from(TAR_FORMATS))
        data = b.build_tar(members, fmt=fmt, compress=draw(st.integers(0, 5)) == 0)
        if draw(st.integers(0, 4)) == 0:
            data = draw(raw_mutations(data))
        return data

    return build()


@fuzz_settings(80, deadline_s=10)
@given(st.data())
def test_tar_bundle(harness: harnesses.BundleHarness, data: st.DataObject) -> None:
    signed = data.draw(st.booleans(), label="signed")
    tar = data.draw(_tar(harness, signed), label="tar")
    harness.check_tar(tar, check_sigs=signed)


@fuzz_settings(30, deadline_s=10)
@given(st.binary(max_size=2048))
@example(b"")
@example(b"\x1f\x8b" + b"\0" * 20)
def test_tar_bundle_noise(harness: harnesses.BundleHarness, data: bytes) -> None:
    harness.check_tar(data)


@fuzz_settings(40, deadline_s=10)
@given(st.data())
def test_dir_bundle(harness: harnesses.BundleHarness, data: st.DataObject) -> None:
    root = harness.sandbox.inputs / "dirbundle"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    b.build_dir(root, data.draw(bundles(harness, signed=False)), harness.sandbox)
    harness.check_path(root)
    shutil.rmtree(root)


@pytest.mark.parametrize("codec", ["gz-crc", "gz-crcnoend", "gz-data", "bz2-data", "xz-data"])
def test_corrupt_compressed_bundle(harness: harnesses.BundleHarness, codec: str) -> None:
    """A damaged gzip/bzip2/xz bundle is refused, whatever the decompressor raises (the gzip
    CRC case was found by the atheris target: BadGzipFile escaped as an untyped OSError)."""
    blob = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(256))  # 8 KiB, incompressible
    variants = {"torch-universal": b.variant_files({"lib/k.so": blob})}
    tar = b.build_tar(b.members_of(b.mirror_files(variants)))
    kind, damage = codec.split("-")
    if damage == "crcnoend":  # no end-of-archive blocks: the scan itself reads to the CRC
        tar = tar[: -2 * tarfile.BLOCKSIZE]
    compress: dict[str, Callable[[bytes], bytes]] = {
        "gz": gzip.compress,
        "bz2": bz2.compress,
        "xz": lzma.compress,
    }
    packed = bytearray(compress[kind](tar))
    if damage.startswith("crc"):
        packed[-8] ^= 0xFF  # gzip trailer: CRC32 of the data
    else:
        packed[len(packed) * 3 // 4] ^= 0xFF  # inside the blob's compressed bytes
    harness.check_tar(bytes(packed))


def test_valid_bundles_import(harness: harnesses.BundleHarness) -> None:
    """The seed bundle imports, signed and unsigned, as a tar and as a directory: the
    fuzzer's mutations start from the success path."""
    variants = {"torch-universal": b.variant_files({"_ops.py": b"# ops\n"})}
    for signed in (False, True):
        tar = b.build_tar(
            b.members_of(b.mirror_files(variants, sign=harness.sign if signed else None))
        )
        harness.check_tar(tar, check_sigs=signed)
    root = harness.sandbox.inputs / "valid-dir"
    b.build_dir(root, b.members_of(b.mirror_files(variants)), harness.sandbox)
    harness.check_path(root)
    assert harness.store.catalog.lookup(inv.REPO, inv.COMMIT, "torch-universal") is not None
