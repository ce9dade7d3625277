"""Provenance at ingest: real sigstore verification of real bundles, from a test-local Sigstore.

The bundles come from tests/support/sigstore_local.py (its own CA, CT log and transparency log);
`sigstore.verify.Verifier` checks them exactly as it checks production bundles. What stays
untested here: Sigstore's public-good trust root itself (its TUF refresh needs the internet).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneld.config import ProvenanceIdentity
from kerneld.pipeline.provenance import KERNELS_DEFAULT_IDENTITIES, SigstoreCheck
from kerneld.store import ProvenanceError, Store
from tests.support.sigstore_local import LocalSigstore, Signer

from .conftest import REPO, metadata_for, publish, variant_files

ME = ProvenanceIdentity(identity="builder@kernels.example", issuer="https://issuer.kernels.example")
COMMUNITY_BUILD = (
    "https://github.com/huggingface/kernels-community/.github/workflows/build.yaml@refs/heads/main"
)


@pytest.fixture(scope="module")
def sigstore() -> LocalSigstore:
    return LocalSigstore()


@pytest.fixture
def trusted_root(sigstore: LocalSigstore, tmp_path: Path) -> Path:
    return sigstore.write_trusted_root(tmp_path / "trusted_root.json")


def _check(trusted_root: Path, policy: str = "warn", **kw: object) -> SigstoreCheck:
    kw.setdefault("identities", (ME,))
    return SigstoreCheck(policy=policy, trusted_root=trusted_root, **kw)  # type: ignore[arg-type]


def _signed(
    sigstore: LocalSigstore, seed: str = "x", signer: Signer | None = None, **meta_kw: object
) -> dict[str, bytes]:
    files = variant_files(seed=seed)
    meta = metadata_for(files, **meta_kw)  # type: ignore[arg-type]
    return {**files, "metadata.json": meta, "metadata.json.sigstore": sigstore.sign(meta, signer)}


def test_a_variant_signed_by_a_trusted_identity_is_recorded_verified(store, sigstore, trusted_root):
    store.signatures.check = _check(trusted_root)
    info = publish(store, files=_signed(sigstore))
    assert info.provenance is not None and info.provenance.status == "verified"
    assert (info.provenance.signer, info.provenance.issuer) == (ME.identity, ME.issuer)
    assert store.signatures.record_of(info.digest) == info.provenance


def test_kernels_own_signers_are_trusted_unless_turned_off(store, sigstore, trusted_root):
    files = _signed(
        sigstore, signer=Signer.github_workflow("huggingface/kernels-community", COMMUNITY_BUILD)
    )
    store.signatures.check = _check(trusted_root, identities=())
    assert publish(store, files=files).provenance.status == "verified"  # type: ignore[union-attr]

    other = _signed(
        sigstore,
        seed="y",
        signer=Signer.github_workflow("huggingface/kernels-community", COMMUNITY_BUILD),
    )
    store.signatures.check = _check(trusted_root, identities=(ME,), kernels_defaults=False)
    record = publish(store, commit="c" * 40, files=other).provenance
    assert record is not None and record.status == "invalid"
    assert COMMUNITY_BUILD in record.detail and ME.identity in record.detail


def test_a_workflow_of_another_repository_is_not_kernels_community(store, sigstore, trusted_root):
    # The same workflow path in a fork: the source repository claim decides, not the file name.
    fork = COMMUNITY_BUILD.replace("huggingface/", "someone/")
    files = _signed(sigstore, signer=Signer.github_workflow("someone/kernels-community", fork))
    store.signatures.check = _check(trusted_root, identities=())
    record = publish(store, files=files).provenance
    assert record is not None and record.status == "invalid"


def test_unsigned_is_recorded_and_served_under_warn_refused_under_require(store, trusted_root):
    store.signatures.check = _check(trusted_root)
    info = publish(store)
    assert info.provenance is not None and info.provenance.status == "unsigned"

    store.signatures.check = _check(trusted_root, "require")
    with pytest.raises(ProvenanceError, match=r"no sigstore signature.*\[provenance\] identities"):
        publish(store, commit="c" * 40, files=variant_files(seed="other"))
    assert store.index.get_variant(REPO, "c" * 40, "torch-cpu") is None
    # a tree already in the store is no way around it: the recorded answer is applied again
    with pytest.raises(ProvenanceError):
        publish(store, commit="d" * 40)


def test_a_signature_over_other_bytes_is_invalid(store, sigstore, trusted_root):
    files = variant_files()
    meta = metadata_for(files)
    bundle = sigstore.sign(metadata_for(files, extra={"version": 2}))
    store.signatures.check = _check(trusted_root)
    record = publish(
        store, files={**files, "metadata.json": meta, "metadata.json.sigstore": bundle}
    ).provenance
    assert record is not None and record.status == "invalid"
    assert "Bundle message digest mismatch" in record.detail


def test_a_signature_from_another_sigstore_instance_is_invalid(store, trusted_root):
    files = _signed(LocalSigstore())  # a CA, CT log and tlog this site does not trust
    store.signatures.check = _check(trusted_root, "require")
    with pytest.raises(ProvenanceError, match="does not verify"):
        publish(store, files=files)


def test_signed_metadata_without_a_digest_vouches_for_no_file(store, sigstore, trusted_root):
    store.signatures.check = _check(trusted_root)
    record = publish(store, files=_signed(sigstore, algorithm=None)).provenance
    assert record is not None and record.status == "invalid"
    assert "no digest" in record.detail


def test_a_garbage_bundle_is_invalid_and_says_so(store, trusted_root):
    files = variant_files()
    files = {**files, "metadata.json": metadata_for(files), "metadata.json.sigstore": b"{not json"}
    store.signatures.check = _check(trusted_root)
    record = publish(store, files=files).provenance
    assert record is not None and record.status == "invalid"
    assert "cannot be parsed" in record.detail


def test_an_unreadable_trust_root_is_unchecked_and_refused_under_require(store, sigstore, tmp_path):
    store.signatures.check = _check(tmp_path / "missing.json", "require")
    with pytest.raises(ProvenanceError, match=r"could not be checked.*missing\.json"):
        publish(store, files=_signed(sigstore))


def test_the_record_lives_and_dies_with_its_tree(store_root, sigstore, trusted_root):
    with Store.open(store_root, min_age_s=0, orphan_grace_s=0) as s:
        s.signatures.check = _check(trusted_root)
        old = publish(s, files=_signed(sigstore, seed="old"))
        new = publish(s, files=_signed(sigstore, seed="new"))  # replaces old at the same commit
    with Store.open(store_root, min_age_s=0, orphan_grace_s=0) as s:
        assert (
            s.signatures.record_of(old.digest) is not None
        )  # recorded in the index, not in memory
        s.gc.collect()
        assert s.signatures.record_of(old.digest) is None
        assert s.signatures.record_of(new.digest) == new.provenance
    with Store.open(store_root, read_only=True) as s:
        assert s.signatures.record_of(new.digest) == new.provenance


def test_a_tree_is_checked_once(store, sigstore, trusted_root):
    calls = []
    check = _check(trusted_root)
    real = check.check

    def counting(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    check.check = counting  # type: ignore[method-assign]
    store.signatures.check = check
    files = _signed(sigstore)
    publish(store, files=files)
    publish(store, commit="c" * 40, files=files)  # the same tree under another revision
    assert len(calls) == 1


def test_kerneld_trusts_exactly_the_signers_kernels_trusts():
    from kernels.verify import DEFAULT_POLICIES

    theirs = [(p.repo_id, list(p.signer_uris)) for p in DEFAULT_POLICIES]  # type: ignore[attr-defined]
    ours = [(i.repository, list(i.workflows)) for i in KERNELS_DEFAULT_IDENTITIES]
    assert ours == theirs


def test_the_bundle_is_the_one_kernels_verifies(sigstore, trusted_root, tmp_path):
    """Cross-check with `kernels.verify.verify_variant` itself (its verifier pointed at the
    test-local trust root): the same variant folder passes there too."""
    import kernels.verify as kverify
    from sigstore.models import TrustedRoot
    from sigstore.verify import Verifier, policy

    folder = tmp_path / "variant"
    folder.mkdir()
    files = variant_files()
    for path, data in files.items():
        (folder / path).write_bytes(data)
    raw = metadata_for(files)
    (folder / "metadata.json").write_bytes(raw)
    (folder / "metadata.json.sigstore").write_bytes(sigstore.sign(raw))
    root = TrustedRoot.from_file(str(trusted_root))
    original = kverify.Verifier.production
    kverify.Verifier.production = classmethod(lambda cls, **kw: Verifier(trusted_root=root))  # type: ignore[method-assign,assignment]
    try:
        result = kverify.verify_variant(
            folder, policies=[policy.Identity(identity=ME.identity, issuer=ME.issuer)]
        )
    finally:
        kverify.Verifier.production = original  # type: ignore[method-assign]
    assert result == kverify.VerificationResult.Success(), result


def test_a_tree_from_before_the_check_is_checked_on_its_first_lookup(store, sigstore, trusted_root):
    """Published while no check was installed: no record. Once signatures are required, its
    first lookup checks it (and records the answer); unsigned is refused, signed is served."""
    signed = publish(store, files=_signed(sigstore, seed="signed"))
    unsigned = publish(store, commit="c" * 40, files=variant_files(seed="plain"))
    assert store.signatures.record_of(signed.digest) is None
    store.signatures.install(_check(trusted_root, "require"))
    hit = store.catalog.lookup(REPO, signed.commit, "torch-cpu")
    assert hit is not None and hit.digest == signed.digest
    assert store.signatures.record_of(signed.digest).status == "verified"  # type: ignore[union-attr]
    with pytest.raises(ProvenanceError, match="no sigstore signature"):
        store.catalog.lookup(REPO, unsigned.commit, "torch-cpu")
    assert store.signatures.record_of(unsigned.digest).status == "unsigned"  # type: ignore[union-attr]
