"""A test-local Sigstore instance: its own certificate authority, CT log and transparency log.

Sigstore's public services are out of reach here (and a test must not depend on them), but the
verifier takes any trusted root. This module is the other side of that: three fresh keys, a
trusted root that names them, and a `sign()` that issues what Fulcio, the CT log and Rekor would
have issued for one signing: a short-lived code-signing certificate carrying the OIDC identity and
an embedded SCT, a `hashedrekord` log entry with its inclusion proof, signed checkpoint and
inclusion promise, all in a v0.3 bundle. `sigstore.verify.Verifier` then checks it exactly as it
checks a production bundle (chain, SCT, policy, log entry, times, signature, body consistency).

The log holds one entry per signing (a one-leaf tree), which keeps the Merkle proof trivial but
still real; the tests about a wrong proof tamper with a real one.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Fulcio's certificate extensions (https://github.com/sigstore/fulcio/blob/main/docs/oid-info.md)
_ISSUER_V1 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
_ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
_BUILD_SIGNER_URI = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.9")
_SOURCE_REPOSITORY_URI = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.12")
_SCT_LIST = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
GITHUB_ACTIONS_ISSUER = "https://token.actions.githubusercontent.com"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _spki(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key_id(key: ec.EllipticCurvePrivateKey) -> bytes:
    return hashlib.sha256(_spki(key)).digest()


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _der(tag: int, content: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(content)) + content


def _utf8(value: str) -> bytes:
    return _der(0x0C, value.encode())


def _key_usage(**allowed: bool) -> x509.KeyUsage:
    """A KeyUsage with only `allowed` set (a CA signs certificates, a leaf signs data)."""
    names = (
        "digital_signature",
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "key_cert_sign",
        "crl_sign",
        "encipher_only",
        "decipher_only",
    )
    return x509.KeyUsage(**{name: allowed.get(name, False) for name in names})


@dataclass(frozen=True)
class Signer:
    """Who signs: the certificate's SAN and OIDC issuer, and for CI builds the GitHub claims."""

    identity: str = "builder@kernels.example"
    issuer: str = "https://issuer.kernels.example"
    source_repository: str | None = None  # "https://github.com/<org>/<repo>"
    build_signer_uri: str | None = None  # ".../.github/workflows/<file>@<ref>"

    @classmethod
    def github_workflow(cls, repo: str, workflow_uri: str) -> Signer:
        return cls(
            identity=workflow_uri,
            issuer=GITHUB_ACTIONS_ISSUER,
            source_repository=f"https://github.com/{repo}",
            build_signer_uri=workflow_uri,
        )


class LocalSigstore:
    """Fresh keys for a CA, a CT log and a transparency log, and the trusted root naming them."""

    def __init__(self, *, now: dt.datetime | None = None) -> None:
        self.now = now or dt.datetime.now(dt.timezone.utc)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ct_key = ec.generate_private_key(ec.SECP256R1())
        self.rekor_key = ec.generate_private_key(ec.SECP256R1())
        self.origin = "rekor.kerneld.test - 1"
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kerneld tests"),
                x509.NameAttribute(NameOID.COMMON_NAME, "kerneld test fulcio"),
            ]
        )
        ski = x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key())
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - dt.timedelta(days=1))
            .not_valid_after(self.now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
            .add_extension(ski, critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )

    # -- the trusted root ---------------------------------------------------------------------

    def trusted_root(self) -> dict[str, object]:
        start = (self.now - dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")

        def log(url: str, key: ec.EllipticCurvePrivateKey) -> dict[str, object]:
            return {
                "baseUrl": url,
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": _b64(_spki(key)),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": {"start": start},
                },
                "logId": {"keyId": _b64(_key_id(key))},
            }

        return {
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [log("https://rekor.kerneld.test", self.rekor_key)],
            "certificateAuthorities": [
                {
                    "subject": {
                        "organization": "kerneld tests",
                        "commonName": "kerneld test fulcio",
                    },
                    "uri": "https://fulcio.kerneld.test",
                    "certChain": {
                        "certificates": [
                            {
                                "rawBytes": _b64(
                                    self.ca_cert.public_bytes(serialization.Encoding.DER)
                                )
                            }
                        ]
                    },
                    "validFor": {"start": start},
                }
            ],
            "ctlogs": [log("https://ctfe.kerneld.test", self.ct_key)],
            "timestampAuthorities": [],
        }

    def write_trusted_root(self, path: Path) -> Path:
        path.write_text(json.dumps(self.trusted_root(), indent=1), encoding="utf-8")
        return path

    # -- signing ------------------------------------------------------------------------------

    def sign(self, data: bytes, signer: Signer | None = None) -> bytes:
        """A v0.3 bundle (JSON bytes) for `data`, as `sigstore sign` writes it."""
        signer = signer or Signer()
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        cert = self._certificate(leaf_key, signer)
        signature = leaf_key.sign(data, ec.ECDSA(hashes.SHA256()))
        digest = hashlib.sha256(data).digest()
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        body = rfc8785.dumps(
            {
                "apiVersion": "0.0.1",
                "kind": "hashedrekord",
                "spec": {
                    "data": {"hash": {"algorithm": "sha256", "value": digest.hex()}},
                    "signature": {
                        "content": _b64(signature),
                        "publicKey": {"content": _b64(cert_pem)},
                    },
                },
            }
        )
        integrated = int(self.now.timestamp())
        log_id = _key_id(self.rekor_key)
        root = hashlib.sha256(b"\x00" + body).digest()  # a one-leaf tree: the root is the leaf
        note = f"{self.origin}\n1\n{_b64(root)}\n"
        note_sig = self.rekor_key.sign(note.encode(), ec.ECDSA(hashes.SHA256()))
        checkpoint = f"{note}\n\u2014 {self.origin.split()[0]} {_b64(log_id[:4] + note_sig)}\n"
        promise = rfc8785.dumps(
            {
                "body": _b64(body),
                "integratedTime": integrated,
                "logID": log_id.hex(),
                "logIndex": 0,
            }
        )
        bundle = {
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {"rawBytes": _b64(cert.public_bytes(serialization.Encoding.DER))},
                "tlogEntries": [
                    {
                        "logIndex": "0",
                        "logId": {"keyId": _b64(log_id)},
                        "kindVersion": {"kind": "hashedrekord", "version": "0.0.1"},
                        "integratedTime": str(integrated),
                        "inclusionPromise": {
                            "signedEntryTimestamp": _b64(
                                self.rekor_key.sign(promise, ec.ECDSA(hashes.SHA256()))
                            )
                        },
                        "inclusionProof": {
                            "logIndex": "0",
                            "rootHash": _b64(root),
                            "treeSize": "1",
                            "hashes": [],
                            "checkpoint": {"envelope": checkpoint},
                        },
                        "canonicalizedBody": _b64(body),
                    }
                ],
            },
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": _b64(digest)},
                "signature": _b64(signature),
            },
        }
        return json.dumps(bundle, indent=1).encode()

    def _certificate(
        self, leaf_key: ec.EllipticCurvePrivateKey, signer: Signer
    ) -> x509.Certificate:
        """A Fulcio-style leaf: the precertificate is logged (SCT) and the SCT embedded."""
        san: x509.GeneralName = (
            x509.UniformResourceIdentifier(signer.identity)
            if "://" in signer.identity
            else x509.RFC822Name(signer.identity)
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.ca_cert.subject)
            .public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - dt.timedelta(minutes=1))
            .not_valid_after(self.now + dt.timedelta(minutes=10))
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName([san]), critical=True)
            .add_extension(
                x509.UnrecognizedExtension(_ISSUER_V1, signer.issuer.encode()), critical=False
            )
            .add_extension(
                x509.UnrecognizedExtension(_ISSUER_V2, _utf8(signer.issuer)), critical=False
            )
        )
        if signer.build_signer_uri:
            builder = builder.add_extension(
                x509.UnrecognizedExtension(_BUILD_SIGNER_URI, _utf8(signer.build_signer_uri)),
                critical=False,
            )
        if signer.source_repository:
            builder = builder.add_extension(
                x509.UnrecognizedExtension(_SOURCE_REPOSITORY_URI, _utf8(signer.source_repository)),
                critical=False,
            )
        precert = builder.sign(self.ca_key, hashes.SHA256())
        sct = self._sct(precert.tbs_certificate_bytes)
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        final = builder.add_extension(
            x509.UnrecognizedExtension(_SCT_LIST, _der(0x04, sct_list)), critical=False
        ).sign(self.ca_key, hashes.SHA256())
        return final

    def _sct(self, tbs: bytes) -> bytes:
        """An RFC 6962 SCT for a precertificate whose TBSCertificate is `tbs`."""
        timestamp = int(self.now.timestamp() * 1000)
        issuer_key_hash = _key_id(self.ca_key)
        signed = (
            struct.pack("!BBQH", 0, 0, timestamp, 1)
            + issuer_key_hash
            + len(tbs).to_bytes(3, "big")
            + tbs
            + struct.pack("!H", 0)
        )
        signature = self.ct_key.sign(signed, ec.ECDSA(hashes.SHA256()))
        return (
            struct.pack("!B", 0)
            + _key_id(self.ct_key)
            + struct.pack("!QH", timestamp, 0)
            + struct.pack("!BBH", 4, 3, len(signature))
            + signature
        )
