"""The export's writes, in their order, and the signatures on its documents.

Blobs first, then each commit's manifest, then the refs: a manifest never names a blob the
mirror does not have yet. Manifests and refs merge with what the destination holds (variants
and refs accumulate); a document whose bytes do not change keeps them and only gains the new
signatures (`write_signed`), so a mirror can carry the signatures of an old and a new key
during a key rotation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kerneld.mirror.destination import ExportError, Target
from kerneld.mirror.documents import (
    INFO,
    Manifest,
    MirrorFormatError,
    info_json,
    manifest_path,
    parse_info,
    parse_refs,
    parse_refs_exported_at,
    refs_json,
    refs_path,
)
from kerneld.mirror.keys import (
    SignatureError,
    SigningKey,
    parse_signature_file,
    sig_path,
    signature_file,
)
from kerneld.mirror.progress import MirrorProgress, ProgressFn, emit
from kerneld.mirror.selection import SelectedKernel
from kerneld.mirror.verdicts import export_verdicts
from kerneld.store import FILE_MODE_EXEC, ExportSource
from kerneld.store.manifest import ManifestEntry
from kerneld.upstream.base import RemoteFile
from kerneld_client.vocabulary import is_commit


@dataclass
class ExportReport:
    """What an export did (kerneldctl prints it; `--json` and the RPC carry `to_dict()`)."""

    destination: str
    kernels: list[dict[str, Any]] = field(default_factory=list)
    manifests_written: int = 0
    manifests_unchanged: int = 0
    blobs_written: int = 0
    blobs_present: int = 0
    bytes_written: int = 0
    signed_by: list[str] = field(default_factory=list)
    skipped_variants: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "kernels": self.kernels,
            "manifests_written": self.manifests_written,
            "manifests_unchanged": self.manifests_unchanged,
            "blobs_written": self.blobs_written,
            "blobs_present": self.blobs_present,
            "bytes_written": self.bytes_written,
            "signed_by": self.signed_by,
            "skipped_variants": self.skipped_variants,
        }


def _manifest_for(kernel: SelectedKernel, verdicts: dict[str, Any] | None = None) -> Manifest:
    variants: dict[str, list[RemoteFile]] = {}
    execs: dict[str, frozenset[str]] = {}
    for name, files in kernel.variants.items():
        entries = []
        for f in files:
            oid = f.upstream_id
            git_sha1 = oid if oid is not None and is_commit(oid) else None
            entries.append(
                RemoteFile(f.entry.path, f.entry.size, sha256=f.entry.sha256, git_sha1=git_sha1)
            )
        variants[name] = entries
        ex = frozenset(f.entry.path for f in files if f.entry.mode == FILE_MODE_EXEC)
        if ex:
            execs[name] = ex
    return Manifest(kernel.repo_id, kernel.commit, variants, execs, verdicts)


def _merge_manifest(target: Target, new: Manifest) -> Manifest:
    """Union with the manifest already at the destination (new variants win)."""
    old_raw = target.read(manifest_path(new.repo_id, new.commit))
    if old_raw is None:
        return new
    try:
        old = Manifest.from_json(old_raw, repo_id=new.repo_id, commit=new.commit)
    except MirrorFormatError:
        return new  # replaced: a broken manifest is worth nothing
    variants = {**old.variants, **new.variants}
    execs = {k: v for k, v in old.executables.items() if k not in new.variants}
    execs.update(new.executables)
    verdicts = new.verdicts
    if verdicts is not None and old.verdicts is not None:  # variants exported before keep theirs
        provenance = {**(old.verdicts.get("provenance") or {}), **verdicts["provenance"]}
        verdicts = {**verdicts, "provenance": provenance}
    return Manifest(new.repo_id, new.commit, variants, execs, verdicts or old.verdicts)


def write_signed(target: Target, rel: str, data: bytes, keys: Sequence[SigningKey]) -> bool:
    """Write `rel` unless identical; keep, extend or drop its signatures. True if rel changed."""
    old = target.read(rel)
    changed = old != data
    if changed:
        target.write(rel, data)
    sig_rel = sig_path(rel)
    if not keys:
        if changed:
            target.delete(sig_rel)  # it signed bytes that are gone
        return changed
    sig = merged_signatures(rel, data, None if changed else target.read(sig_rel), keys)
    if sig is not None:
        target.write(sig_rel, sig)
    return changed


def merged_signatures(
    rel: str, data: bytes, old_sig: bytes | None, keys: Sequence[SigningKey]
) -> bytes | None:
    """The `.sig` file of `data` with each key's signature added to those of `old_sig` (which
    must sign these same bytes); None when it already holds them all."""
    old_sigs: dict[str, bytes] = {}
    if old_sig is not None:
        try:
            old_sigs = parse_signature_file(old_sig, rel=rel)
        except SignatureError:
            old_sigs = {}
    # Ed25519 signatures are deterministic: an equal signature means nothing to add.
    fresh = {k.name: k.sign(rel, data) for k in keys}
    if old_sig is not None and all(old_sigs.get(n) == v for n, v in fresh.items()):
        return None
    return signature_file({**old_sigs, **fresh})


def write_export(
    store: ExportSource,
    target: Target,
    kernels: dict[tuple[str, str], SelectedKernel],
    refs: dict[str, dict[str, str]],
    keys: Sequence[SigningKey],
    name: str,
    report: ExportReport,
    progress: ProgressFn | None,
) -> None:
    """Write the selected `kernels` and `refs` to `target`, counting what was done in `report`."""
    info = target.read(INFO)
    if info is None:
        target.write(INFO, info_json(name))
    else:
        try:
            parse_info(info)
        except MirrorFormatError as exc:
            raise ExportError(f"{report.destination}: {exc}") from None

    # Blobs first: a manifest never names a blob the mirror does not have yet.
    todo: dict[str, ManifestEntry] = {}
    for kernel in kernels.values():
        for files in kernel.variants.values():
            for f in files:
                todo.setdefault(f.entry.sha256, f.entry)
    missing = {s: e for s, e in todo.items() if not target.has_blob(s, e.size)}
    total = sum(e.size for e in missing.values())
    done = 0
    report.blobs_present = len(todo) - len(missing)
    for _sha, entry in sorted(missing.items()):
        done += target.put_blob(store.blobs, entry)
        report.blobs_written += 1
        emit(
            progress,
            MirrorProgress(
                "blob",
                detail=entry.path,
                bytes_done=done,
                bytes_total=total,
                blobs=report.blobs_written,
            ),
        )
    report.bytes_written = done

    for (repo, commit), kernel in sorted(kernels.items()):
        trees = {}
        for variant in kernel.variants:
            tree = store.catalog.published_tree(repo, commit, variant)
            if tree is not None:
                trees[variant] = tree.digest
        verdicts = export_verdicts(store, repo, trees)
        manifest = _merge_manifest(target, _manifest_for(kernel, verdicts))
        rel = manifest_path(repo, commit)
        if write_signed(target, rel, manifest.to_json(), keys):
            report.manifests_written += 1
        else:
            report.manifests_unchanged += 1
        report.kernels.append(
            {
                "repo_id": repo,
                "commit": commit,
                "variants": sorted(kernel.variants),
                "refs": sorted(r for r, c in refs.get(repo, {}).items() if c == commit),
            }
        )
        emit(
            progress,
            MirrorProgress(
                "manifest",
                repo_id=repo,
                commit=commit,
                detail=", ".join(sorted(kernel.variants)),
                manifests=len(report.kernels),
            ),
        )

    now = time.time()
    for repo in sorted({r for r, _c in kernels} | set(refs)):
        branches: dict[str, str] = {}
        tags: dict[str, str] = {}
        old = target.read(refs_path(repo))
        if old is not None:
            try:
                branches, tags = parse_refs(old, repo)
            except MirrorFormatError:
                branches, tags = {}, {}
        before = (dict(branches), dict(tags))
        for ref, commit in refs.get(repo, {}).items():
            (tags if ref in tags else branches)[ref] = commit
        # Unchanged refs keep their bytes (and so the signatures other keys made of them),
        # unless they lack the export time an import needs to refuse a rollback.
        unchanged = old is not None and (branches, tags) == before
        if unchanged and old is not None and parse_refs_exported_at(old) is not None:
            data = old
        else:
            data = refs_json(repo, branches, tags, now)
        write_signed(target, refs_path(repo), data, keys)
