"""Mirror export/import through the Python API: signatures, incrementality, hostile bundles.

Every refusal test also checks the other half of the promise: nothing of a refused kernel is
published in the importing store (and for whole-bundle refusals, nothing at all was ingested).
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import time
from pathlib import Path

import pytest

from kerneld.mirror.bundle import HAS_DATA_FILTER, MAX_DOC_BYTES
from kerneld.mirror.destination import ExportError
from kerneld.mirror.documents import Manifest, blob_path, manifest_path
from kerneld.mirror.export import export_mirror
from kerneld.mirror.import_ import MirrorImportRefused, import_mirror
from kerneld.mirror.keys import (
    KeyFileError,
    SignatureError,
    SigningKey,
    generate_key,
    load_public_key,
    load_signing_key,
    make_signature_file,
    parse_public_key,
    verify_signature,
)
from kerneld.mirror.selection import ExportSpec, specs_from_wire
from kerneld.store import Store
from tests.support.ctl import publish, sha256, tree_bytes, variant_files

K, J = "org/k", "org/j"
CK, CJ, CK2 = "c" * 40, "d" * 40, "e" * 40
SO = b"\x7fELF" + bytes(range(256)) * 40


@pytest.fixture
def source(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "src")
    publish(
        store,
        K,
        CK,
        "torch-universal",
        variant_files("_k_1", {"lib.so": SO, "tool.sh": b"#!/bin/sh\n"}),
        refs=("v1", "main"),
        lfs=("lib.so",),
        executable=("tool.sh",),
    )
    publish(store, K, CK, "torch-cpu", variant_files("_k_cpu", {"x.py": b"X = 1\n"}))
    publish(store, J, CJ, "torch-cpu", variant_files("_j_1", {"j.py": b"J = 2\n"}), refs=("v2",))
    yield store
    store.close()


@pytest.fixture
def target(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "dst")
    yield store
    store.close()


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return generate_key("site-1", tmp_path / "keys")


def trust(key: SigningKey) -> dict[str, str]:
    return {key.name: key.public}


def everything() -> list[ExportSpec]:
    return [ExportSpec(K), ExportSpec(J)]


def assert_nothing_imported(store: Store) -> None:
    assert store.index.repos() == []
    assert store.space.usage().blobs == 0


# ---- keys and signature files -------------------------------------------------------------------


def test_key_files(tmp_path: Path, key: SigningKey) -> None:
    key_dir = tmp_path / "keys"
    priv = key_dir / "site-1.key"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert load_public_key("site-1", key_dir) == key.public
    assert load_signing_key("site-1", key_dir).public == key.public
    parse_public_key(key.public)
    with pytest.raises(KeyFileError, match="already exists"):
        generate_key("site-1", key_dir)
    os.chmod(priv, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signing_key("site-1", key_dir)
    with pytest.raises(KeyFileError, match="kerneldctl key generate"):
        load_signing_key("nope", key_dir)
    with pytest.raises(KeyFileError, match="invalid key name"):
        generate_key("../x", key_dir)
    with pytest.raises(KeyFileError, match="ed25519:"):
        parse_public_key("ssh-ed25519 AAAA")


def test_signature_file_rules(tmp_path: Path, key: SigningKey) -> None:
    other = generate_key("site-2", tmp_path / "keys")
    rel, data = "manifests/org/k/" + CK + ".json", b"{}"
    sig = make_signature_file(rel, data, [key, other])
    assert set(json.loads(sig)["signatures"]) == {"site-1", "site-2"}
    assert verify_signature(rel, data, sig, {"site-2": parse_public_key(other.public)}) == "site-2"
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature(rel, data + b" ", sig, {"site-1": parse_public_key(key.public)})
    with pytest.raises(SignatureError, match="does not match"):  # replayed under another name
        verify_signature(rel + "x", data, sig, {"site-1": parse_public_key(key.public)})
    with pytest.raises(SignatureError, match="none of which is trusted"):
        verify_signature(rel, data, sig, {"site-9": parse_public_key(key.public)})
    with pytest.raises(SignatureError, match="not signed"):
        verify_signature(rel, data, None, {"site-1": parse_public_key(key.public)})
    with pytest.raises(SignatureError, match="not valid JSON"):
        verify_signature(rel, data, b"{", {"site-1": parse_public_key(key.public)})


# ---- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("dest_name", ["mirror", "bundle.tar"])
def test_round_trip(
    tmp_path: Path, source: Store, target: Store, key: SigningKey, dest_name: str
) -> None:
    dest = tmp_path / dest_name
    events = []
    report = export_mirror(source, dest, everything(), sign_keys=[key], progress=events.append)
    assert {(k["repo_id"], k["commit"]) for k in report.kernels} == {(K, CK), (J, CJ)}
    assert report.blobs_written > 0 and events[-1].kind == "finished"
    got = []
    result = import_mirror(target, dest, trust(key), progress=got.append)
    assert result.ok, result.refused
    assert {k.kind for k in got} >= {"signature-ok", "manifest", "blob", "finished"}
    for repo, commit, variant in (
        (K, CK, "torch-universal"),
        (K, CK, "torch-cpu"),
        (J, CJ, "torch-cpu"),
    ):
        a = source.catalog.lookup(repo, commit, variant)
        b = target.catalog.lookup(repo, commit, variant)
        assert a is not None and b is not None
        assert a.digest == b.digest  # same paths, modes and bytes
        assert tree_bytes(a.path) == tree_bytes(b.path)
        assert source.catalog.upstream_ids(repo, commit, variant) == target.catalog.upstream_ids(
            repo, commit, variant
        )
    hit = target.catalog.lookup(K, "v1", "torch-universal")
    assert hit is not None and os.access(hit.path / "tool.sh", os.X_OK)
    assert target.names.resolve_revision(J, "v2") == CJ
    # idempotent: a second import changes nothing and ingests nothing
    again = import_mirror(target, dest, trust(key))
    assert again.ok and again.blobs_ingested == 0 and again.blobs_present > 0
    assert again.refs_set == []


def test_an_export_is_a_mirror_upstream(tmp_path: Path, source: Store, target: Store) -> None:
    """Daemons can use an exported directory as an upstream directly (no import step)."""
    from kerneld.mirror.upstream import MirrorDirUpstream
    from kerneld.pipeline.resolve import KernelSpec, Resolver
    from kerneld_client.variants import PlatformFacts

    dest = tmp_path / "m"
    export_mirror(source, dest, everything())
    resolver = Resolver(target, [MirrorDirUpstream(dest)])
    facts = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)
    got = resolver.resolve(KernelSpec(K, version=1), facts, variant="torch-universal")
    want = source.catalog.lookup(K, "v1", "torch-universal")
    assert want is not None and got.commit == CK
    # same bytes; (the fetcher does not carry the manifest's exec bits, so the digest may not)
    assert tree_bytes(got.hit.path) == tree_bytes(want.path)


def test_a_signed_mirror_upstream_refuses_what_its_keys_do_not_vouch_for(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    """`require_signatures`: signed refs and manifests are served; a tampered, unsigned or
    foreign-signed document is an integrity failure (the next upstream is asked), never a kernel
    and never a cached "not found"."""
    from kerneld.mirror.upstream import MirrorDirUpstream
    from kerneld.pipeline.resolve import KernelSpec, Resolver
    from kerneld.upstream.errors import UpstreamProtocolError
    from kerneld_client.variants import PlatformFacts

    facts = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)
    keys = {key.name: parse_public_key(key.public)}
    signed, unsigned = tmp_path / "signed", tmp_path / "unsigned"
    export_mirror(source, signed, everything(), sign_keys=[key])
    export_mirror(source, unsigned, everything())

    good = MirrorDirUpstream(signed, trusted_keys=keys)
    got = Resolver(target, [good]).resolve(KernelSpec(K, version=1), facts)
    assert got.commit == CK

    with pytest.raises(UpstreamProtocolError, match="is not signed"):
        MirrorDirUpstream(unsigned, trusted_keys=keys).list_refs(J)
    other = generate_key("site-2", tmp_path / "keys")
    with pytest.raises(UpstreamProtocolError, match="no signature by a trusted key|trusted"):
        MirrorDirUpstream(
            signed, trusted_keys={"site-2": parse_public_key(other.public)}
        ).list_refs(J)

    # Tampering with a signed manifest (serve J's commit with another variant list).
    rel = manifest_path(J, CJ)
    doc = json.loads((signed / rel).read_text())
    doc["variants"]["torch-evil"] = doc["variants"]["torch-cpu"]
    (signed / rel).write_text(json.dumps(doc))
    tampered = MirrorDirUpstream(signed, trusted_keys=keys)
    with pytest.raises(UpstreamProtocolError, match="does not match"):
        tampered.list_variants(J, CJ)
    # Without required signatures the same mirror happily serves the tampered manifest.
    assert "torch-evil" in MirrorDirUpstream(signed).list_variants(J, CJ)
    # Through a resolver: the integrity failure falls through to the next upstream.
    resolved = Resolver(target, [tampered, MirrorDirUpstream(unsigned)]).resolve(
        KernelSpec(J, version=2), facts
    )
    assert resolved.commit == CJ and resolved.fetched is not None
    assert resolved.fetched.upstream == MirrorDirUpstream(unsigned).name


def test_incremental_export_merges_and_skips(
    tmp_path: Path, source: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    first = export_mirror(
        source, dest, [ExportSpec(K, ref="v1")], variants=["torch-cpu"], sign_keys=[key]
    )
    assert first.manifests_written == 1
    blob = dest / blob_path(sha256(b"X = 1\n"))
    before = blob.stat()
    second = export_mirror(source, dest, [ExportSpec(K, ref="v1"), ExportSpec(J)], sign_keys=[key])
    assert second.blobs_present >= 1 and blob.stat().st_ino == before.st_ino
    manifest = Manifest.from_json((dest / manifest_path(K, CK)).read_bytes(), repo_id=K, commit=CK)
    assert set(manifest.variants) == {"torch-cpu", "torch-universal"}
    third = export_mirror(source, dest, everything(), sign_keys=[key])
    assert third.blobs_written == 0 and third.manifests_written == 0
    assert third.manifests_unchanged == 2


def test_key_rotation_keeps_old_signatures(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    new = generate_key("site-2", tmp_path / "keys")
    export_mirror(source, dest, everything(), sign_keys=[key])
    export_mirror(source, dest, everything(), sign_keys=[new])
    sig = json.loads((dest / (manifest_path(K, CK) + ".sig")).read_text())
    assert set(sig["signatures"]) == {"site-1", "site-2"}
    assert import_mirror(target, dest, trust(new)).ok
    assert import_mirror(target, dest, trust(key)).ok


def test_specs_from_lock_and_wire(tmp_path: Path, source: Store, key: SigningKey) -> None:
    from kerneld_client.lockfile import parse_lockfile
    from kerneld_client.proto import kerneld_pb2

    lock = json.dumps([{"dependency": {"repo-id": J, "version": 2}, "lock": {"commit": CJ}}])
    specs = specs_from_wire([kerneld_pb2.KernelRef(repo_id=K, version=1)], lockfile_json=lock)
    assert specs == [ExportSpec(K, ref="v1"), ExportSpec(J, ref="v2", commit=CJ)]
    assert parse_lockfile(lock).format == "0.17"
    report = export_mirror(source, tmp_path / "m", specs, sign_keys=[key])
    assert {k["repo_id"] for k in report.kernels} == {K, J}


def test_export_refuses_what_it_cannot_do(tmp_path: Path, source: Store) -> None:
    with pytest.raises(ExportError, match="does not know that revision"):
        export_mirror(source, tmp_path / "m", [ExportSpec(K, ref="v9")])
    with pytest.raises(ExportError, match="nothing of it is in the store"):
        export_mirror(source, tmp_path / "m", [ExportSpec("org/none")])
    with pytest.raises(ExportError, match="none of the variants"):
        export_mirror(source, tmp_path / "m", [ExportSpec(J)], variants=["torch-universal"])
    assert not (tmp_path / "m").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "data.txt").write_text("mine")
    with pytest.raises(ExportError, match="not a kerneld mirror"):
        export_mirror(source, busy, [ExportSpec(J)])


def test_export_never_copies_a_corrupt_store_blob(tmp_path: Path, source: Store) -> None:
    path = source.layout.blob_path(sha256(b"J = 2\n"))
    os.chmod(path, 0o644)
    path.write_bytes(b"J = 3\n")
    with pytest.raises(ExportError, match="corrupt"):
        export_mirror(source, tmp_path / "m", [ExportSpec(J)])
    assert not (tmp_path / "m" / blob_path(sha256(b"J = 2\n"))).exists()


# ---- refusals -----------------------------------------------------------------------------------


def test_unsigned_bundle_refused_unless_asked(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything())
    with pytest.raises(MirrorImportRefused, match="not signed"):
        import_mirror(target, dest, trust(key))
    assert_nothing_imported(target)
    with pytest.raises(MirrorImportRefused, match="no trusted mirror keys"):
        import_mirror(target, dest, {})
    report = import_mirror(target, dest, {}, no_check_sigs=True)
    assert report.ok and not report.signatures_checked
    assert target.catalog.lookup(J, "v2", "torch-cpu") is not None


def test_wrong_key_refused(tmp_path: Path, source: Store, target: Store, key: SigningKey) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything(), sign_keys=[key])
    stranger = generate_key("site-1", tmp_path / "other-keys")  # same name, other key
    with pytest.raises(MirrorImportRefused, match="does not match"):
        import_mirror(target, dest, trust(stranger))
    with pytest.raises(MirrorImportRefused, match="none of which is trusted"):
        import_mirror(target, dest, {"site-9": key.public})
    assert_nothing_imported(target)


@pytest.mark.parametrize("what", ["manifest", "refs"])
def test_tampered_documents_refused(
    tmp_path: Path, source: Store, target: Store, key: SigningKey, what: str
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything(), sign_keys=[key])
    if what == "manifest":
        path = dest / manifest_path(K, CK)
        doc = json.loads(path.read_text())
        doc["variants"]["torch-cpu"]["files"][0]["size"] += 1
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    else:
        path = dest / "refs" / "org" / "j.json"
        doc = json.loads(path.read_text())
        doc["branches"]["v2"] = CK2  # roll a ref to another commit
        path.write_text(json.dumps(doc))
    with pytest.raises(MirrorImportRefused, match="does not match"):
        import_mirror(target, dest, trust(key))
    assert_nothing_imported(target)


def test_tampered_blob_refuses_only_its_kernel(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything(), sign_keys=[key])
    bad = dest / blob_path(sha256(SO))
    data = bytearray(bad.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    report = import_mirror(target, dest, trust(key))
    assert not report.ok
    assert [r["repo_id"] for r in report.refused] == [K]
    assert "does not match" in report.refused[0]["reason"]
    # nothing of K is published, not even its intact torch-cpu variant; J is complete
    assert target.catalog.variants(K, CK) == []
    assert target.names.get_ref(K, "v1") is None
    assert target.catalog.lookup(J, "v2", "torch-cpu") is not None


def test_missing_blob_refuses_its_kernel(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything(), sign_keys=[key])
    (dest / blob_path(sha256(b"J = 2\n"))).unlink()
    report = import_mirror(target, dest, trust(key))
    assert [r["repo_id"] for r in report.refused] == [J]
    assert "missing from the bundle" in report.refused[0]["reason"]
    assert (
        target.catalog.variants(J, CJ) == []
        and target.catalog.lookup(K, "v1", "torch-cpu") is not None
    )


def test_huge_declared_sizes_refused_before_copying(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, [ExportSpec(J)], sign_keys=[key])
    rel = manifest_path(J, CJ)
    for size, message in ((1 << 50, "over the"), (1 << 36, "has room for")):
        doc = json.loads((dest / rel).read_text())
        doc["variants"]["torch-cpu"]["files"][0]["size"] = size
        data = json.dumps(doc).encode()
        (dest / rel).write_bytes(data)
        (dest / (rel + ".sig")).write_bytes(make_signature_file(rel, data, [key]))
        capped = Store.open(tmp_path / f"capped-{size}", cap_bytes=1 << 30)
        try:
            with pytest.raises(MirrorImportRefused, match=message):
                import_mirror(capped, dest, trust(key))
            assert_nothing_imported(capped)
        finally:
            capped.close()


def test_ref_never_rolled_back(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, [ExportSpec(J)], sign_keys=[key])
    publish(target, J, CK2, "torch-cpu", variant_files("_j_2"))
    target.names.set_ref(J, "v2", CK2, fetched_at=time.time() + 60)  # learned after the export
    report = import_mirror(target, dest, trust(key))
    assert report.ok and report.refs_kept and target.names.resolve_revision(J, "v2") == CK2


def test_interrupted_import_resumes(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything(), sign_keys=[key])

    def stop_after_first_blob(ev: object) -> None:
        if getattr(ev, "kind", "") == "blob":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_mirror(target, dest, trust(key), progress=stop_after_first_blob)
    assert target.index.repos() == [] and target.space.usage().blobs == 1
    report = import_mirror(target, dest, trust(key))
    assert report.ok and report.blobs_present == 1


# ---- hostile tar files --------------------------------------------------------------------------


def _tar_with(tmp_path: Path, good: Path, extra: list[tarfile.TarInfo], data: bytes = b"") -> Path:
    out = tmp_path / "evil.tar"
    with tarfile.open(good) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        for info in extra:
            dst.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_info("../evil.txt", size=4), "path traversal"),
        (_info("/etc/evil", size=4), "absolute path"),
        (_info("blobs/sha256/aa/link", tarfile.SYMTYPE, link="/etc/passwd"), "links are not"),
        (_info("blobs/sha256/aa/hard", tarfile.LNKTYPE, link="mirror-info"), "links are not"),
        (_info("blobs/dev", tarfile.CHRTYPE), "not a regular file"),
        (_info("blobs/fifo", tarfile.FIFOTYPE), "not a regular file"),
        (_info("mirror-info", size=4), "appears twice"),
    ],
)
@pytest.mark.parametrize(
    "use_tar_filter",
    [
        pytest.param(False, id="own-checks"),
        pytest.param(
            True,
            id="tarfile-filter",
            marks=pytest.mark.skipif(not HAS_DATA_FILTER, reason="no tar filters in this Python"),
        ),
    ],
)
def test_unsafe_tar_members_refuse_the_bundle(
    tmp_path: Path,
    source: Store,
    target: Store,
    key: SigningKey,
    member: tarfile.TarInfo,
    message: str,
    use_tar_filter: bool,
) -> None:
    good = tmp_path / "good.tar"
    export_mirror(source, good, everything(), sign_keys=[key])
    evil = _tar_with(tmp_path, good, [member], b"evil")
    with pytest.raises(MirrorImportRefused, match=message):
        import_mirror(target, evil, trust(key), use_tar_filter=use_tar_filter)
    assert_nothing_imported(target)
    assert not (tmp_path / "evil.txt").exists()


def test_truncated_tar_refused(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    good = tmp_path / "good.tar"
    export_mirror(source, good, everything(), sign_keys=[key])
    raw = good.read_bytes()
    with tarfile.open(good) as tar:
        members = tar.getmembers()
    last = members[-1]
    cuts = {
        "in a header": members[len(members) // 2].offset + 100,
        "in the last blob": last.offset_data + last.size // 2,
    }
    for where, cut in cuts.items():
        bad = tmp_path / "cut.tar"
        bad.write_bytes(raw[:cut])
        with pytest.raises(MirrorImportRefused, match="truncated|corrupt") as info:
            import_mirror(target, bad, trust(key))
        assert info.value, where
        assert_nothing_imported(target)
    # Cut exactly between members: nothing says members are missing but the absent end marker.
    (tmp_path / "short.tar").write_bytes(raw[: last.offset])
    with pytest.raises(MirrorImportRefused, match="end-of-archive marker"):
        import_mirror(target, tmp_path / "short.tar", trust(key))
    assert_nothing_imported(target)


def test_tar_member_declaring_a_huge_size_refused(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    good = tmp_path / "good.tar"
    export_mirror(source, good, everything(), sign_keys=[key])
    with tarfile.open(good) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    header = _info("blobs/sha256/ab/huge", size=1 << 40).tobuf(tarfile.PAX_FORMAT)
    evil = tmp_path / "evil.tar"
    evil.write_bytes(good.read_bytes()[:end] + header + b"x" * 512 + bytes(1024))
    with pytest.raises(MirrorImportRefused, match="past the end of the archive"):
        import_mirror(target, evil, trust(key))
    assert_nothing_imported(target)


def test_oversized_document_refused(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, [ExportSpec(J)], sign_keys=[key])
    with (dest / manifest_path(J, CJ)).open("ab") as fh:
        fh.truncate(MAX_DOC_BYTES + 1)
    with pytest.raises(MirrorImportRefused, match="limit"):
        import_mirror(target, dest, trust(key))
    assert_nothing_imported(target)


def test_symlink_or_special_file_in_a_directory_bundle_refused(
    tmp_path: Path, source: Store, target: Store, key: SigningKey
) -> None:
    dest = tmp_path / "m"
    export_mirror(source, dest, everything(), sign_keys=[key])
    blob = dest / blob_path(sha256(b"J = 2\n"))
    blob.unlink()
    blob.symlink_to("/etc/hostname")
    with pytest.raises(MirrorImportRefused, match="symlinks are not allowed"):
        import_mirror(target, dest, trust(key))
    blob.unlink()
    os.mkfifo(blob)
    with pytest.raises(MirrorImportRefused, match="not a regular file"):
        import_mirror(target, dest, trust(key))
    assert_nothing_imported(target)


def test_not_a_mirror_refused(tmp_path: Path, target: Store) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(MirrorImportRefused, match="not a kerneld mirror"):
        import_mirror(target, tmp_path / "empty", {})
    (tmp_path / "junk.tar").write_bytes(b"definitely not a tar" * 100)
    with pytest.raises(MirrorImportRefused, match="not a readable tar"):
        import_mirror(target, tmp_path / "junk.tar", {})
    with pytest.raises(MirrorImportRefused, match="does not exist"):
        import_mirror(target, tmp_path / "nowhere", {})
