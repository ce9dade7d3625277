"""Import a mirror bundle into a store: `kerneldctl mirror import` and the `MirrorImport` RPC.

Order of trust:

1. the bundle is scanned (`kerneld.mirror.bundle`): unsafe paths, links, special files or a
   truncated tar refuse it before anything else is read;
2. every manifest and refs file is checked against its detached signature and the trusted keys
   (unless `no_check_sigs`); one bad or missing signature refuses the whole bundle;
3. manifests are parsed and checked (paths, variant names, declared sizes against the store's
   free space); a malformed one refuses the whole bundle;
4. per kernel revision: every blob goes through the store's verified ingest with the
   manifest's sha256 and size, then every variant's `metadata.json` digest is checked, and only
   then are the variant trees published. A kernel revision with any bad blob is refused and
   nothing of it is published; the other kernels are imported (the report lists both);
5. refs are set for imported commits, never moving a ref the store learned more recently
   (a refs file without `exported_at` refuses the bundle: its age cannot be told).

A tar is scanned documents first: at its first blob, signatures are checked and the blobs
the manifests name are known, so a forged or junk-filled tar costs its documents only.

Blobs are content-addressed, so a second run skips what is present: imports are idempotent, and
an interrupted one resumes (partially ingested blobs continue where they stopped).
"""

from __future__ import annotations

import logging
import lzma
import os
import re
import tarfile
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kerneld.mirror.bundle import (
    HAS_DATA_FILTER,
    Bundle,
    BundleError,
    DirBundle,
    open_bundle,
)
from kerneld.mirror.documents import (
    INFO,
    Manifest,
    MirrorFormatError,
    blob_path,
    parse_info,
    parse_refs,
    parse_refs_exported_at,
)
from kerneld.mirror.keys import SignatureError, sig_path, trusted_key_set, verify_signature
from kerneld.mirror.progress import MirrorProgress, ProgressFn, emit
from kerneld.mirror.verdicts import imported_repos, repos_entry, trusted_by_exporter
from kerneld.store import (
    BlobMissingError,
    DeniedError,
    Hold,
    ImportTarget,
    IntegrityError,
    ResourceExhaustedError,
    StoreError,
    TreeFile,
)
from kerneld.store.paths import check_unique_paths, validate_relpath, validate_variant
from kerneld.upstream.base import check_repo_id
from kerneld_client.published_index import PUBLISHERS_FILE, PUBLISHERS_FORMAT
from kerneld_client.vocabulary import repo_key

log = logging.getLogger("kerneld.mirror.import")

_MANIFEST_RE = re.compile(r"^manifests/([^/]+/[^/]+)/([0-9a-f]{40})\.json$")
_REFS_RE = re.compile(r"^refs/([^/]+/[^/]+)\.json$")
#: No single kernel file is this big; a manifest claiming more is refused before any copy.
MAX_FILE_BYTES = 64 << 30
CHUNK = 1 << 20


class MirrorImportRefused(ValueError):
    """The whole bundle was refused before anything was imported."""


@dataclass
class ImportReport:
    source: str
    imported: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    blobs_ingested: int = 0
    blobs_present: int = 0
    bytes_ingested: int = 0
    refs_set: list[str] = field(default_factory=list)
    refs_kept: list[str] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)
    signatures_checked: bool = True
    publishers_vouched: dict[str, str] = field(default_factory=dict)
    """repo -> how the exporting site trusted its publisher ("hub", "allow", "any"): the
    signed verdicts of what was imported, recorded for this host's `[trust]`."""
    without_verdicts: list[str] = field(default_factory=list)
    """Imported repos whose manifests carry no publisher verdict (an older kerneld's bundle,
    or an unsigned import): they need this host's `[trust] allow` (or the Hub)."""
    exported_provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    """"repo@commit [variant]" -> the exporting site's provenance record (informational)."""

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "ok": self.ok,
            "imported": self.imported,
            "refused": self.refused,
            "blobs_ingested": self.blobs_ingested,
            "blobs_present": self.blobs_present,
            "bytes_ingested": self.bytes_ingested,
            "refs_set": self.refs_set,
            "refs_kept": self.refs_kept,
            "signatures_checked": self.signatures_checked,
            "signed_by": sorted(set(self.signatures.values())),
            "publishers_vouched": self.publishers_vouched,
            "without_verdicts": self.without_verdicts,
            "exported_provenance": self.exported_provenance,
        }


@dataclass
class _Kernel:
    manifest: Manifest
    rel: str


@dataclass(frozen=True)
class _Refs:
    repo_id: str
    refs: dict[str, str]
    exported_at: float


def _trusted(keys: Mapping[str, str] | Mapping[str, Ed25519PublicKey]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    as_text = {n: k for n, k in keys.items() if isinstance(k, str)}
    out.update(trusted_key_set(as_text))
    out.update({n: k for n, k in keys.items() if isinstance(k, Ed25519PublicKey)})
    return out


def _doc(bundle: Bundle, rel: str) -> bytes:
    data = bundle.read_doc(rel)
    if data is None:  # pragma: no cover - only called for listed files
        raise MirrorImportRefused(f"{rel} disappeared from {bundle.description}")
    return data


def _check_signatures(
    bundle: Bundle,
    rels: list[str],
    trusted: Mapping[str, Ed25519PublicKey],
    report: ImportReport,
    progress: ProgressFn | None,
) -> dict[str, bytes]:
    """Read and verify every signed document; returns rel -> bytes (the verified bytes)."""
    if not trusted:
        raise MirrorImportRefused(
            "no trusted mirror keys are configured: add the exporting site's public key under "
            "[mirror] trusted_keys in kerneld.toml (see `kerneldctl key public NAME` on the "
            "exporting host), or pass --no-check-sigs to import an unsigned bundle"
        )
    docs: dict[str, bytes] = {}
    for rel in rels:
        data = _doc(bundle, rel)
        try:
            key = verify_signature(rel, data, bundle.read_doc(sig_path(rel)), trusted)
        except SignatureError as exc:
            raise MirrorImportRefused(f"signature check failed: {exc}") from None
        docs[rel] = data
        report.signatures[rel] = key
        m = _MANIFEST_RE.match(rel)
        emit(
            progress,
            MirrorProgress(
                "signature-ok",
                repo_id=m.group(1) if m else "",
                commit=m.group(2) if m else "",
                detail=f"{rel} signed by {key}",
            ),
        )
    return docs


def _parse(bundle: Bundle, docs: dict[str, bytes], rel: str) -> Manifest:
    m = _MANIFEST_RE.match(rel)
    assert m is not None
    repo, commit = m.group(1), m.group(2)
    try:
        check_repo_id(repo)
        manifest = Manifest.from_json(docs[rel], repo_id=repo, commit=commit)
    except (MirrorFormatError, ValueError) as exc:
        raise MirrorImportRefused(f"{rel}: {exc}") from None
    if not manifest.variants:
        raise MirrorImportRefused(f"{rel}: the manifest lists no variants")
    for variant, files in manifest.variants.items():
        ctx = {"repo_id": repo, "commit": commit}
        try:
            validate_variant(variant, **ctx)
            for f in files:
                validate_relpath(f.path, variant=variant, **ctx)
            check_unique_paths((f.path for f in files), variant=variant, **ctx)
        except StoreError as exc:
            raise MirrorImportRefused(f"{rel}: {exc}") from None
        for f in files:
            if f.size > MAX_FILE_BYTES:
                raise MirrorImportRefused(
                    f"{rel}: {variant}/{f.path} declares {f.size} bytes, over the "
                    f"{MAX_FILE_BYTES}-byte limit for one file"
                )
            assert f.sha256 is not None  # the layout requires it
    return manifest


def _check_space(store: ImportTarget, kernels: list[_Kernel]) -> None:
    """Refuse up front when the declared sizes cannot fit the store."""
    need: dict[str, int] = {}
    for k in kernels:
        for files in k.manifest.variants.values():
            for f in files:
                assert f.sha256 is not None
                need[f.sha256] = f.size
    missing = sum(size for sha, size in need.items() if not store.blobs.has_blob(sha))
    usage = store.space.usage()
    room = usage.free_bytes - usage.min_free_bytes - usage.bytes_reserved
    if usage.cap_bytes is not None:
        room = min(room, usage.cap_bytes - usage.bytes_used - usage.bytes_reserved)
    if missing > room:
        raise MirrorImportRefused(
            f"the bundle's new files need {missing} bytes but the store has room for {room} "
            "(cap or free-space watermark); free space or raise the cap first"
        )


def _ingest_blob(
    store: ImportTarget, bundle: Bundle, sha: str, size: int, ctx: dict[str, str]
) -> tuple[bool, str | None]:
    """(ingested now?, error or None)."""
    if store.blobs.has_blob(sha):
        return False, None
    rel = blob_path(sha)
    entry = bundle.files.get(rel)
    if entry is None:
        return False, f"blob {sha} is missing from the bundle"
    if entry.size != size:
        return False, f"blob {sha} is {entry.size} bytes in the bundle, the manifest says {size}"
    try:
        if isinstance(bundle, DirBundle):
            store.blobs.ingest_file(bundle.path(rel), sha256=sha, size=size, **ctx)
        else:
            with bundle.open_blob(rel) as fh:
                store.blobs.ingest(fh, size=size, sha256=sha, **ctx)
    except IntegrityError as exc:
        return False, f"blob {sha} does not match the manifest: {exc}"
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, BundleError) as exc:
        return False, f"blob {sha}: the tar is truncated or corrupt: {exc}"
    except StoreError as exc:
        return False, f"blob {sha}: {exc}"
    except OSError as exc:
        return False, f"blob {sha}: cannot read it: {exc.strerror or exc}"
    return True, None


def _check_variant_metadata(store: ImportTarget, manifest: Manifest, variant: str) -> str | None:
    """The metadata.json checks publish_tree will make, made before anything is published."""
    files = [
        TreeFile(path=f.path, sha256=str(f.sha256), size=f.size)
        for f in manifest.variants[variant]
        if f.sha256
    ]
    try:
        store.trees.check_files_metadata(manifest.repo_id, manifest.commit, variant, files)
    except StoreError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read a blob just ingested: {exc}"
    return None


def _import_kernel(
    store: ImportTarget,
    bundle: Bundle,
    kernel: _Kernel,
    report: ImportReport,
    state: dict[str, Any],
    progress: ProgressFn | None,
    hold: Hold,
) -> None:
    manifest = kernel.manifest
    repo, commit = manifest.repo_id, manifest.commit

    def refuse(reason: str) -> None:
        report.refused.append({"repo_id": repo, "commit": commit, "reason": reason})
        log.warning("mirror import: refused %s@%s: %s", repo, commit, reason)
        emit(progress, MirrorProgress("refused", repo_id=repo, commit=commit, detail=reason))

    try:
        store.names.check_denied(repo, commit, commit)
    except DeniedError as exc:
        refuse(f"denied on this host: {exc}")
        return
    emit(
        progress,
        MirrorProgress(
            "manifest",
            repo_id=repo,
            commit=commit,
            detail=", ".join(sorted(manifest.variants)),
            manifests=state["manifests"],
        ),
    )
    ctx = {"repo_id": repo, "commit": commit}
    blobs: dict[str, int] = {}
    for files in manifest.variants.values():
        for f in files:
            blobs[str(f.sha256)] = f.size
    for sha, size in sorted(blobs.items()):
        error = state["bad"].get(sha)
        fresh = False
        if error is None:
            fresh, error = _ingest_blob(store, bundle, sha, size, ctx)
        if error is not None:
            state["bad"][sha] = error
            refuse(error)
            return
        if fresh:
            report.blobs_ingested += 1
            report.bytes_ingested += size
            state["done"] += size
        else:
            report.blobs_present += 1
        emit(
            progress,
            MirrorProgress(
                "blob",
                repo_id=repo,
                commit=commit,
                bytes_done=state["done"],
                bytes_total=state["total"],
                blobs=report.blobs_ingested,
                skipped_existing=not fresh,
            ),
        )
    for variant in sorted(manifest.variants):
        problem = _check_variant_metadata(store, manifest, variant)
        if problem is not None:
            refuse(problem)
            return
    published: list[dict[str, str]] = []
    for variant, files in sorted(manifest.variants.items()):
        tree_files = [
            TreeFile(
                path=f.path,
                sha256=str(f.sha256),
                size=f.size,
                mode=0o100755 if manifest.is_executable(variant, f.path) else 0o100644,
                upstream_id=f.git_sha1 or f.sha256,
            )
            for f in files
        ]
        hold.add(repo, commit, variant)
        try:
            tree = store.trees.publish_tree(repo, commit, variant, tree_files)
        except (BlobMissingError, IntegrityError, DeniedError, ResourceExhaustedError) as exc:
            refuse(f"publishing {variant} failed after {len(published)} variant(s): {exc}")
            return
        published.append({"variant": variant, "tree_digest": tree.digest, "path": str(tree.path)})
    report.imported.append({"repo_id": repo, "commit": commit, "variants": published})
    _take_verdicts(manifest, report)


def _take_verdicts(manifest: Manifest, report: ImportReport) -> None:
    """Keep the signed verdicts of an imported kernel (unsigned ones vouch for nothing)."""
    repo = manifest.repo_id
    by = trusted_by_exporter(manifest.verdicts) if report.signatures_checked else None
    if by is not None:
        report.publishers_vouched[repo] = by
    elif repo not in report.without_verdicts and repo not in report.publishers_vouched:
        report.without_verdicts.append(repo)
    provenance = (manifest.verdicts or {}).get("provenance")
    if report.signatures_checked and isinstance(provenance, dict):
        for variant, record in sorted(provenance.items()):
            if isinstance(record, dict) and variant in manifest.variants:
                report.exported_provenance[f"{repo}@{manifest.commit} [{variant}]"] = record


def record_in_store(store: ImportTarget, vouched: Mapping[str, str]) -> None:
    """Record an import's publisher verdicts in the store's publishers.json (an import with
    no daemon: the daemon reads them back at start)."""
    if not vouched:
        return
    doc = dict(store.published.read_document(PUBLISHERS_FILE) or {})
    if doc.get("format") != PUBLISHERS_FORMAT:
        # No daemon has published its policy here yet: the default policy, which the daemon
        # rewrites at start (keeping these verdicts).
        doc = {
            "format": PUBLISHERS_FORMAT,
            "version": 1,
            "policy": "hub",
            "allow": [],
            "honor_trust_remote_code": True,
            "orgs": {},
        }
    repos = imported_repos(doc)
    now = time.time()
    repos.update({repo_key(r): now for r in vouched})
    doc["repos"] = repos_entry(repos)
    store.published.publish_document(PUBLISHERS_FILE, doc)


def _apply_refs(store: ImportTarget, parsed: dict[str, _Refs], report: ImportReport) -> None:
    imported = {(k["repo_id"], k["commit"]) for k in report.imported}
    now = time.time()
    for refs in parsed.values():
        repo = refs.repo_id
        when = min(refs.exported_at, now)
        for ref, commit in sorted(refs.refs.items()):
            label = f"{repo}@{ref}"
            if (repo, commit) not in imported and not store.catalog.variants(repo, commit):
                continue  # the ref points at a commit this bundle (or store) does not have
            current = store.names.get_ref(repo, ref)
            if current is not None and current.commit != commit and current.fetched_at > when:
                report.refs_kept.append(f"{label} -> {current.commit} (newer than the bundle)")
                continue
            if current is None or current.commit != commit:
                store.names.set_ref(repo, ref, commit, fetched_at=when)
                report.refs_set.append(f"{label} -> {commit}")


def _documents(bundle: Bundle) -> tuple[list[str], list[str]]:
    """The manifest and refs paths of a bundle; refused without its info file or manifests."""
    try:
        parse_info(_doc(bundle, INFO) if INFO in bundle.files else b"")
    except MirrorFormatError as exc:
        raise MirrorImportRefused(f"{bundle.description}: {exc}") from None
    manifests = sorted(r for r in bundle.files if _MANIFEST_RE.match(r))
    refs = sorted(r for r in bundle.files if _REFS_RE.match(r))
    if not manifests:
        raise MirrorImportRefused(f"{bundle.description} contains no manifests")
    return manifests, refs


def _gate(
    bundle: Bundle, trusted: Mapping[str, Ed25519PublicKey], no_check_sigs: bool
) -> frozenset[str]:
    """Run by the tar scan at the first blob: the documents are all read by then, so a bundle
    without manifests or valid signatures is refused before any blob member is scanned (a
    hostile tar of 300,000 members costs its documents, not its members). Returns the blob
    paths the manifests name; the scan bounds the members that are not among them."""
    if INFO not in bundle.files:
        raise MirrorImportRefused(
            f"{bundle.description} has no {INFO} before its blobs: not a kerneld mirror "
            "(made by `kerneldctl mirror export`)"
        )
    manifests, refs = _documents(bundle)
    if no_check_sigs:
        docs = {rel: _doc(bundle, rel) for rel in manifests}
    else:
        scratch = ImportReport(source=bundle.description)
        docs = _check_signatures(bundle, manifests + refs, trusted, scratch, None)
    names: set[str] = set()
    for rel in manifests:
        for files in _parse(bundle, docs, rel).variants.values():
            names.update(blob_path(str(f.sha256)) for f in files)
    return frozenset(names)


def _parse_refs(docs: dict[str, bytes], refs_rels: list[str]) -> dict[str, _Refs]:
    """Every refs document, checked before anything is imported. One without `exported_at` is
    refused: without it an import cannot tell an old bundle from a new one, and a replayed old
    (validly signed) refs file would move a ref back to an older commit."""
    out: dict[str, _Refs] = {}
    for rel in refs_rels:
        m = _REFS_RE.match(rel)
        assert m is not None
        repo = m.group(1)
        try:
            check_repo_id(repo)
            branches, tags = parse_refs(docs[rel], repo)
            exported_at = parse_refs_exported_at(docs[rel])
        except (MirrorFormatError, ValueError) as exc:
            raise MirrorImportRefused(f"{rel}: {exc}") from None
        if exported_at is None:
            raise MirrorImportRefused(
                f"{rel}: the refs carry no 'exported_at' time, so this import cannot tell "
                "whether they are older than what the store knows (a replayed old bundle "
                "would move refs back); re-export the bundle with `kerneldctl mirror export`"
            )
        out[rel] = _Refs(repo, {**tags, **branches}, exported_at)
    return out


def import_mirror(
    store: ImportTarget,
    source: str | os.PathLike[str],
    trusted_keys: Mapping[str, str] | Mapping[str, Ed25519PublicKey],
    *,
    no_check_sigs: bool = False,
    progress: ProgressFn | None = None,
    use_tar_filter: bool = HAS_DATA_FILTER,
    record_verdicts: Callable[[Mapping[str, str]], None] | None = None,
) -> ImportReport:
    """Import the mirror directory or tar file `source` into `store`.

    `trusted_keys`: key name -> public key (`ed25519:<base64>` strings as in the config, or
    key objects). Raises MirrorImportRefused when the bundle as a whole is refused (nothing
    imported); per-kernel refusals are in the report (`report.ok` is False).
    `use_tar_filter`: also apply tarfile's data filter where this Python has it (our own
    member checks always run; False tests the path of Pythons without it).
    `record_verdicts`: takes the signed publisher verdicts of what was imported (the daemon's
    publisher trust); default: written to the store's publishers.json (no daemon).
    """
    report = ImportReport(source=os.fspath(source), signatures_checked=not no_check_sigs)
    trusted = {} if no_check_sigs else _trusted(trusted_keys)

    def gate(bundle: Bundle) -> frozenset[str]:
        return _gate(bundle, trusted, no_check_sigs)

    try:
        with open_bundle(source, gate=gate, use_filter=use_tar_filter) as bundle:
            _import(store, bundle, trusted, no_check_sigs, report, progress)
        if record_verdicts is not None:
            record_verdicts(report.publishers_vouched)
        else:
            record_in_store(store, report.publishers_vouched)
        for repo, by in sorted(report.publishers_vouched.items()):
            emit(progress, MirrorProgress("verdict", repo_id=repo, detail=by))
        for repo in report.without_verdicts:
            emit(progress, MirrorProgress("verdict", repo_id=repo))
    except BundleError as exc:
        emit(progress, MirrorProgress("refused", detail=str(exc)))
        raise MirrorImportRefused(str(exc)) from None
    except MirrorImportRefused as exc:
        emit(progress, MirrorProgress("refused", detail=str(exc)))
        raise
    emit(
        progress,
        MirrorProgress(
            "finished",
            manifests=len(report.imported),
            blobs=report.blobs_ingested,
            bytes_done=report.bytes_ingested,
            bytes_total=report.bytes_ingested,
            detail=(
                f"imported {len(report.imported)} kernel revision(s), refused {len(report.refused)}"
            ),
        ),
    )
    return report


def _import(
    store: ImportTarget,
    bundle: Bundle,
    trusted: Mapping[str, Ed25519PublicKey],
    no_check_sigs: bool,
    report: ImportReport,
    progress: ProgressFn | None,
) -> None:
    manifests, refs = _documents(bundle)
    if no_check_sigs:
        log.warning(
            "mirror import from %s WITHOUT signature checks (--no-check-sigs): only the "
            "content hashes in the manifests protect this import",
            bundle.description,
        )
        docs = {rel: _doc(bundle, rel) for rel in manifests + refs}
    else:
        docs = _check_signatures(bundle, manifests + refs, trusted, report, progress)
    kernels = [_Kernel(_parse(bundle, docs, rel), rel) for rel in manifests]
    parsed_refs = _parse_refs(docs, refs)
    _check_space(store, kernels)
    total = 0
    seen: set[str] = set()
    for k in kernels:
        for files in k.manifest.variants.values():
            for f in files:
                sha = str(f.sha256)
                if sha not in seen and not store.blobs.has_blob(sha):
                    total += f.size
                seen.add(sha)
    state: dict[str, Any] = {"bad": {}, "done": 0, "total": total, "manifests": 0}
    # What the import published stays held until it ends: a later kernel's reservation must
    # not evict an earlier one that the report (and the refs) then claim is here.
    with store.holds.hold() as hold:
        for k in kernels:
            state["manifests"] += 1
            _import_kernel(store, bundle, k, report, state, progress, hold)
        _apply_refs(store, parsed_refs, report)
