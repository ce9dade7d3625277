"""Provenance at ingest: a variant's sigstore bundle, verified once, by the daemon.

`kernels` 0.17 ships signed builds (``metadata.json.sigstore`` next to ``metadata.json``) and a
``kernels verify-signature`` command, but a job never runs it. kerneld runs the same check when a
tree enters the store, with the same policies, and records the answer with the tree; every job
that loads the tree afterwards gets it for free (``kerneldctl ls``, ``kernelize_report``), and
``[provenance] policy = "require"`` refuses what does not pass.

The chain is the one `kernels.verify.verify_variant` checks: the bundle proves that a trusted
identity signed ``metadata.json``'s bytes, and that file's ``digest`` covers every other file (the
store has already checked the digest against the bytes it holds, so ``digest_checked`` closes the
chain). A signature over metadata without a digest vouches for no binary, so it does not count.

sigstore is imported only when a bundle is there: a store of unsigned kernels never pays for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kerneld.config import PROVENANCE_POLICIES, Config, ProvenanceIdentity
from kerneld.store import ProvenanceRecord, log_context
from kerneld.store.manifest import METADATA_FILE
from kerneld.store.manifest import SIGSTORE_FILE as BUNDLE_FILE

if TYPE_CHECKING:
    from cryptography.x509 import Certificate
    from sigstore.verify import Verifier
    from sigstore.verify.policy import VerificationPolicy

log = logging.getLogger("kerneld.provenance")

GITHUB_ACTIONS_ISSUER = "https://token.actions.githubusercontent.com"


#: `kernels` 0.17.2's curated signers (kernels.verify.DEFAULT_POLICIES): the kernels-community
#: build workflows. Kept here as data so the daemon does not import `kernels`; a test holds the
#: two lists equal.
KERNELS_DEFAULT_IDENTITIES: tuple[ProvenanceIdentity, ...] = (
    ProvenanceIdentity(
        repository="huggingface/kernels-community",
        workflows=tuple(
            f"https://github.com/huggingface/kernels-community/.github/workflows/{name}"
            "@refs/heads/main"
            for name in (
                "build.yaml",
                "build-mac.yaml",
                "build-windows.yaml",
                "sign-old-builds.yaml",
            )
        ),
    ),
)


def _policy(identity: ProvenanceIdentity) -> VerificationPolicy:
    from sigstore.verify import policy

    if identity.repository:
        return policy.AllOf(
            [
                policy.OIDCIssuer(GITHUB_ACTIONS_ISSUER),
                policy.OIDCIssuerV2(GITHUB_ACTIONS_ISSUER),
                policy.OIDCSourceRepositoryURI(f"https://github.com/{identity.repository}"),
                policy.AnyOf([policy.OIDCBuildSignerURI(uri) for uri in identity.workflows]),
            ]
        )
    return policy.Identity(identity=identity.identity, issuer=identity.issuer)


def _signer(cert: Certificate) -> tuple[str, str]:
    """The certificate's identity (SAN) and OIDC issuer, for the record."""
    from cryptography import x509

    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = [*san.get_values_for_type(x509.RFC822Name)]
    names += san.get_values_for_type(x509.UniformResourceIdentifier)
    try:
        raw = cert.extensions.get_extension_for_oid(
            x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
        ).value
        issuer = raw.value.decode() if isinstance(raw, x509.UnrecognizedExtension) else ""
    except x509.ExtensionNotFound:
        issuer = ""
    return (names[0] if names else ""), issuer


class SigstoreCheck:
    """`store.signatures.check` for `[provenance]`: verify a variant's bundle against the trusted
    identities, with Sigstore's public-good trust root or the site's own (`trusted_root`)."""

    def __init__(
        self,
        *,
        policy: str,
        identities: Sequence[ProvenanceIdentity] = (),
        kernels_defaults: bool = True,
        trusted_root: Path | None = None,
        offline: bool = False,
    ) -> None:
        if policy not in PROVENANCE_POLICIES:
            raise ValueError(
                f"provenance policy must be one of {PROVENANCE_POLICIES}, got {policy!r}"
            )
        self.policy = policy
        self.identities = (*(KERNELS_DEFAULT_IDENTITIES if kernels_defaults else ()), *identities)
        self.trusted_root = trusted_root
        self.offline = offline
        """Never refresh the public-good trust root over the network (an import-only host:
        the copy shipped with sigstore, or `trusted_root`)."""
        self._verifier: Verifier | None = None
        self._lock = threading.Lock()

    @property
    def required(self) -> bool:
        return self.policy == "require"

    def _get_verifier(self) -> Verifier:
        """Built once: the trust root is a file read (a site's own) or a TUF refresh (the
        public-good instance; the copy shipped with sigstore when the refresh fails)."""
        from sigstore.models import TrustedRoot
        from sigstore.verify import Verifier

        with self._lock:
            if self._verifier is None:
                if self.trusted_root is not None:
                    root = TrustedRoot.from_file(str(self.trusted_root))
                    self._verifier = Verifier(trusted_root=root)
                elif self.offline:
                    self._verifier = Verifier.production(offline=True)
                else:
                    try:
                        self._verifier = Verifier.production()
                    except Exception as exc:  # TUF refresh: network, cache dir, metadata
                        log.warning(
                            "provenance: cannot refresh Sigstore's trust root (%s); using the "
                            "copy shipped with sigstore",
                            exc,
                        )
                        self._verifier = Verifier.production(offline=True)
            return self._verifier

    def check(
        self, read: Callable[[str], bytes | None], *, digest_checked: bool, **ctx: str | None
    ) -> ProvenanceRecord:
        record = self._check(read, digest_checked)
        where = log_context(ctx)
        if record.verified:
            log.info(
                "provenance verified signer=%s issuer=%s %s", record.signer, record.issuer, where
            )
        elif record.status == "unsigned":
            log.info("provenance unsigned %s", where)
        else:
            log.warning("provenance %s %s: %s", record.status, where, record.detail)
        return record

    def _check(self, read: Callable[[str], bytes | None], digest_checked: bool) -> ProvenanceRecord:
        now = time.time()

        def result(
            status: str, detail: str, signer: str = "", issuer: str = ""
        ) -> ProvenanceRecord:
            return ProvenanceRecord(status, signer, issuer, detail, now)

        raw_bundle = read(BUNDLE_FILE)
        if raw_bundle is None:
            return result("unsigned", f"the variant has no {BUNDLE_FILE}")
        metadata = read(METADATA_FILE)
        if metadata is None:
            return result("invalid", f"{BUNDLE_FILE} without {METADATA_FILE}")
        if not self.identities:
            return result("invalid", "no trusted identity: [provenance] names none")

        from sigstore.errors import Error as SigstoreError
        from sigstore.models import Bundle
        from sigstore.verify import policy

        try:
            bundle = Bundle.from_json(raw_bundle)
        except (SigstoreError, ValueError) as exc:
            return result("invalid", f"{BUNDLE_FILE} cannot be parsed: {exc}")
        try:
            verifier = self._get_verifier()
        except (OSError, ValueError, SigstoreError) as exc:
            where = self.trusted_root or "Sigstore's public-good instance"
            return result("unchecked", f"cannot load the trust root ({where}): {exc}")
        trusted = policy.AnyOf([_policy(i) for i in self.identities])
        try:
            verifier.verify_artifact(metadata, bundle, trusted)
        except SigstoreError as exc:
            signer, issuer = _signer(bundle.signing_certificate)
            trusted_names = "; ".join(i.describe() for i in self.identities)
            return result(
                "invalid",
                f"signature by {signer or 'an unknown identity'} (issuer {issuer or '?'}) does not "
                f"verify against the trusted identities ({trusted_names}): {exc}",
            )
        signer, issuer = _signer(bundle.signing_certificate)
        if not digest_checked:
            return result(
                "invalid",
                f"{METADATA_FILE} is signed but has no digest, so the signature covers none of "
                "the kernel's files",
            )
        return result("verified", f"signed by {signer}", signer, issuer)


def provenance_check(cfg: Config) -> SigstoreCheck | None:
    """The store's ingest check for `cfg`'s `[provenance]` (None: "off")."""
    if cfg.provenance_policy == "off":
        return None
    return SigstoreCheck(
        policy=cfg.provenance_policy,
        identities=cfg.provenance_identities,
        kernels_defaults=cfg.provenance_kernels_defaults,
        trusted_root=cfg.provenance_trusted_root,
        offline=cfg.import_only,
    )
