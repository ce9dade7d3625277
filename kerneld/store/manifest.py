"""Canonical tree manifests, tree digests and the ``metadata.json`` digest check.

A tree is named by the sha256 of its canonical manifest (``sha256:<hex>``)::

    kerneld-tree-v1\\n
    <mode, 4 octal digits> <size> <sha256 hex> <relative path>\\n     (one line per file)

Lines are sorted by the UTF-8 bytes of the path. Paths are validated first (no control
characters), so the format is unambiguous. Only content, paths and modes enter the digest: the
same variant content in two revisions or two repos is one tree.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kerneld_client.metadata import backend_of

# The header and the line format live in the client (KERNELD_VERIFY rebuilds manifests from the
# files on disk): one definition for both sides.
from kerneld_client.tree_verify import MANIFEST_HEADER, manifest_line

from .errors import MetadataDigestError, MetadataError
from .layout import FILE_MODE_BLOB, FILE_MODE_EXEC

METADATA_FILE = "metadata.json"
SIGSTORE_FILE = "metadata.json.sigstore"
MAX_METADATA_BYTES = 1 << 20
DIGEST_ALGORITHMS = {"sha256": 32, "sha512": 64}
#: `metadata.json` `name`: the Kernel Hub grammar `^[a-z][-a-z0-9]*[a-z0-9]$`, also allowing a
#: single letter and inner underscores (builds made from a python name carry them). Either way it
#: is one plain path component: no slash, no dot, never absolute.
KERNEL_NAME = re.compile(r"[a-z](?:[-_a-z0-9]*[a-z0-9])?")


def _shorten(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class TreeFile:
    """One file of a variant as the caller (the fetcher) describes it.

    ``mode`` is the upstream's mode (git ``0o100644``/``0o100755`` or POSIX); symlinks and other
    types are rejected. ``size``, if given, must equal the ingested blob's size. ``upstream_id``
    is the id the upstream announced (LFS sha256 or git blob sha1), recorded in the index.
    """

    path: str
    sha256: str
    size: int | None = None
    mode: int = 0o100644
    upstream_id: str | None = None


@dataclass(frozen=True, order=True)
class ManifestEntry:
    path: str
    mode: int
    size: int
    sha256: str

    def line(self) -> bytes:
        return manifest_line(self.mode, self.size, self.sha256, self.path)


def sort_entries(entries: Iterable[ManifestEntry]) -> list[ManifestEntry]:
    return sorted(entries, key=lambda e: e.path.encode("utf-8"))


def canonical_manifest(entries: Iterable[ManifestEntry]) -> bytes:
    return MANIFEST_HEADER + b"".join(e.line() for e in sort_entries(entries))


def tree_digest(entries: Iterable[ManifestEntry]) -> str:
    """``sha256:<hex>`` of the canonical manifest."""
    return "sha256:" + hashlib.sha256(canonical_manifest(entries)).hexdigest()


def parse_manifest(data: bytes) -> list[ManifestEntry]:
    """Inverse of :func:`canonical_manifest` (the index stores the manifest text)."""
    if not data.startswith(MANIFEST_HEADER):
        raise ValueError("not a kerneld-tree-v1 manifest")
    out = []
    for line in data[len(MANIFEST_HEADER) :].decode("utf-8").splitlines():
        mode, size, sha, path = line.split(" ", 3)
        out.append(ManifestEntry(path, int(mode, 8), int(size), sha))
    return out


@dataclass(frozen=True)
class VariantMetadata:
    """The parts of ``metadata.json`` the store publishes in the published index."""

    id: str | None = None
    name: str | None = None
    version: int | None = None
    backend: str | None = None
    archs: list[str] = field(default_factory=list)
    digest_algorithm: str | None = None


def parse_metadata(raw: bytes, **ctx: str | None) -> tuple[dict[str, Any], VariantMetadata]:
    if len(raw) > MAX_METADATA_BYTES:
        raise MetadataError(
            f"metadata.json is {len(raw)} bytes, over the {MAX_METADATA_BYTES} limit", **ctx
        )
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # also bad UTF-8, and numbers longer than int() converts
        raise MetadataError(f"metadata.json is not valid JSON: {exc}", **ctx) from None
    except RecursionError:
        raise MetadataError("metadata.json is not valid JSON: nested too deeply", **ctx) from None
    if not isinstance(doc, dict):
        raise MetadataError("metadata.json is not a JSON object", **ctx)
    backend_type, archs = backend_of(doc)
    name = doc.get("name")
    if name is not None and (not isinstance(name, str) or not KERNEL_NAME.fullmatch(name)):
        # The client imports `<variant>/<name with dashes as underscores>/`: anything but a
        # plain name (absolute, `..`, slashes, dots) would point it at code outside the tree.
        raise MetadataError(
            f"metadata.json 'name' must be a Kernel Hub name (lowercase letters, digits, inner "
            f"dashes or underscores, starting with a letter), got {_shorten(name)}; the build is "
            "malformed or hostile, so it is not published",
            **ctx,
        )
    digest = doc.get("digest")
    algorithm = digest.get("algorithm") if isinstance(digest, dict) else None
    meta = VariantMetadata(
        id=doc["id"] if isinstance(doc.get("id"), str) else None,
        name=name,
        version=doc["version"] if type(doc.get("version")) is int else None,
        backend=backend_type,
        archs=archs,
        digest_algorithm=algorithm if isinstance(algorithm, str) else None,
    )
    return doc, meta


def check_metadata_digest(
    doc: Mapping[str, Any],
    entries: Mapping[str, ManifestEntry],
    hash_file: Callable[[str, str], bytes],
    *,
    require: bool,
    **ctx: str | None,
) -> bool:
    """Check ``doc["digest"]`` against the variant's files.

    ``hash_file(algorithm, path)`` returns the raw digest of a file for algorithms other than
    sha256 (whose digest the manifest already holds). Returns False when there is no ``digest``
    and ``require`` is false; raises :class:`MetadataDigestError` on any disagreement.
    """
    digest = doc.get("digest")
    if digest is None:
        if require:
            raise MetadataDigestError(detail="metadata.json has no 'digest' field", **ctx)
        return False
    if not isinstance(digest, dict):
        raise MetadataDigestError(detail="'digest' is not an object", **ctx)
    algorithm = digest.get("algorithm")
    if not isinstance(algorithm, str) or algorithm not in DIGEST_ALGORITHMS:
        raise MetadataDigestError(
            detail=f"unsupported digest algorithm {algorithm!r} (sha256 or sha512)", **ctx
        )
    files = digest.get("files")
    if not isinstance(files, dict):
        raise MetadataDigestError(detail="'digest.files' is not an object", **ctx)
    covered = {p for p in entries if p not in (METADATA_FILE, SIGSTORE_FILE)}
    unknown = sorted(p for p in files if p not in covered)
    missing = sorted(p for p in covered if p not in files)
    mismatched = []
    bad_encoding = []
    for path in sorted(covered & set(files)):
        value = files[path]
        try:
            want = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        except (binascii.Error, ValueError):
            want = b""
        if len(want) != DIGEST_ALGORITHMS[algorithm]:
            bad_encoding.append(path)
            continue
        if algorithm == "sha256":
            have = bytes.fromhex(entries[path].sha256)
        else:
            have = hash_file(algorithm, path)
        if have != want:
            mismatched.append(path)
    if unknown or missing or mismatched or bad_encoding:
        detail = (
            f"not a base64 {algorithm} digest: {', '.join(bad_encoding)}" if bad_encoding else ""
        )
        raise MetadataDigestError(
            unknown=unknown, missing=missing, mismatched=mismatched, detail=detail, **ctx
        )
    return True


def tree_mode_ok(mode: int) -> bool:
    return mode in (FILE_MODE_BLOB, FILE_MODE_EXEC)
