"""The index's rows, as the rest of the store sees them: frozen dataclasses, no SQL; and the
protocol of the provenance check a daemon installs (here, so that `state` needs no part)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

ALL = "*"


def decode_archs(text: str) -> list[str]:
    """A tree's `archs` column (a JSON list) as a new list."""
    return list(_archs(text))


@functools.lru_cache(maxsize=1024)
def _archs(text: str) -> tuple[str, ...]:
    """Each distinct value decoded once: a store holds a handful (`[]`, one list per CUDA
    build), while opening a 100,000-tree store or planning its GC reads every row (json.loads
    was 0.5 s of each)."""
    return tuple(json.loads(text))


@dataclass(frozen=True)
class TreeRow:
    digest: str
    size: int
    files: int
    copied_bytes: int
    manifest: bytes
    metadata_id: str | None
    backend: str | None
    archs: list[str]
    state: str
    created_at: float
    last_resolved: float


@dataclass(frozen=True)
class ProvenanceRecord:
    """What the ingest check found out about a tree's signature (kerneld/pipeline/provenance.py)."""

    status: str
    """"verified" (signed by a trusted identity, and the signed metadata's digest covers the
    files), "unsigned" (no bundle), "invalid" (a bundle that does not verify, or an untrusted
    signer) or "unchecked" (the check could not run: no trust root)."""
    signer: str = ""
    """The certificate's identity (an email or a workflow URI); empty unless verified."""
    issuer: str = ""
    """The OIDC issuer that vouched for the signer; empty unless verified."""
    detail: str = ""
    """Why, in words: the verifier's reason for anything but "verified"."""
    checked_at: float = 0.0

    @property
    def verified(self) -> bool:
        return self.status == "verified"


@dataclass(frozen=True)
class BlobRow:
    sha256: str
    size: int
    git_sha1: str | None
    state: str
    created_at: float


@dataclass(frozen=True)
class VariantRow:
    repo: str
    commit: str
    variant: str
    tree: str
    published_at: float


@dataclass(frozen=True)
class LiveVariantRow:
    """A published variant whose tree is live, with what the published index says about it."""

    commit: str
    variant: str
    tree: str
    metadata_id: str | None
    backend: str | None
    archs: list[str]
    provenance: ProvenanceRecord | None = None


@dataclass(frozen=True)
class RefRow:
    repo: str
    ref: str
    commit: str
    fetched_at: float


@dataclass(frozen=True)
class DenyRow:
    repo: str
    revision: str
    reason: str
    created_at: float


@dataclass(frozen=True)
class PinRow:
    repo: str
    revision: str
    variant: str
    created_at: float


@dataclass(frozen=True)
class LeaseRow:
    id: str
    tree: str
    holder: str
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class NegativeRow:
    repo: str
    revision: str
    variant: str
    reason: str
    created_at: float
    expires_at: float


class ProvenanceCheck(Protocol):
    """The ingest check a daemon installs (``store.signatures.check``): who signed a variant.

    The store stays free of any signing scheme; it hands over a variant's files by path, once
    per new tree, after the files and the metadata digest have been verified.
    """

    @property
    def required(self) -> bool:
        """Refuse (ProvenanceError) every tree that is not "verified"?"""
        ...

    def check(
        self, read: Callable[[str], bytes | None], *, digest_checked: bool, **ctx: str | None
    ) -> ProvenanceRecord:
        """The record for one variant: `read(path)` gives a file's bytes (None: no such file);
        `digest_checked` says metadata.json's digest was there and matched every file."""
        ...
