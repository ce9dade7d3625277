"""Write a (signed) mirror out of a store: `kerneldctl mirror export` and the `MirrorExport` RPC.

Only what the store holds is exported (prefetch first): for every selected kernel the published
variants of the chosen commit, their blobs (re-hashed while copied, so store corruption never
reaches a mirror), a per-commit manifest and the refs that led there. Exports are incremental:
a blob the destination already has is not copied again, manifests and refs are merged with what
is there (variants and refs accumulate), and an unchanged manifest only gains the new signatures
(so a mirror can carry the signatures of an old and a new key during a key rotation).

A destination ending in `.tar` is assembled in a staging directory beside it (starting from the
existing tar's contents, read through the same safety checks as an import) and renamed into
place at the end, so a reader never sees a half-written tar.

This module runs the stages, each in its own module: `selection` (what the store gives, held
from GC while it is copied), `writing` (blobs, manifests, refs, in that order, and their
signatures), `destination` (a directory written here, or a stream to the caller) and `tarball`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kerneld.mirror.destination import (
    DirTarget,
    ExportError,
    FileOp,
    StreamTarget,
    Target,
    check_doc_rel,
)
from kerneld.mirror.keys import SigningKey
from kerneld.mirror.progress import MirrorProgress, ProgressFn, emit
from kerneld.mirror.selection import ExportSpec, leased, select
from kerneld.mirror.tarball import is_tar_destination, pack_tar, unpack_existing
from kerneld.mirror.writing import ExportReport, write_export
from kerneld.store import ExportSource


def export_mirror(
    store: ExportSource,
    dest: str | os.PathLike[str],
    specs: Iterable[ExportSpec],
    *,
    variants: Sequence[str] | None = None,
    sign_keys: Sequence[SigningKey] = (),
    name: str = "",
    progress: ProgressFn | None = None,
) -> ExportReport:
    """Export `specs` from `store` to the mirror directory or `.tar` file `dest`.

    `variants`: None or ["all"] for every variant the store has of each commit, else names
    (those the store lacks are listed in `report.skipped_variants`; a commit with none of them
    is an error). `sign_keys`: every manifest and refs file gets a detached signature by each.
    Raises ExportError (nothing written) when a spec cannot be satisfied from the store.
    """
    dest_path = Path(dest)
    spec_list = list(specs)
    if not spec_list:
        raise ExportError("nothing to export: name kernels or give a lock file")
    kernels, refs, skipped = select(store, spec_list, variants)
    report = ExportReport(destination=str(dest_path), skipped_variants=skipped)
    report.signed_by = [k.name for k in sign_keys]
    with leased(store, kernels):
        if is_tar_destination(dest_path):
            dest_path.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(
                tempfile.mkdtemp(dir=dest_path.parent, prefix=f".{dest_path.name}.staging-")
            )
            try:
                if dest_path.exists():
                    unpack_existing(dest_path, staging)
                target: Target = DirTarget(staging, name)
                write_export(store, target, kernels, refs, sign_keys, name, report, progress)
                pack_tar(staging, dest_path)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        else:
            target = DirTarget(dest_path, name)
            write_export(store, target, kernels, refs, sign_keys, name, report, progress)
    _finished(progress, report, str(dest_path))
    return report


def _finished(progress: ProgressFn | None, report: ExportReport, where: str) -> None:
    emit(
        progress,
        MirrorProgress(
            "finished",
            manifests=len(report.kernels),
            blobs=report.blobs_written,
            bytes_done=report.bytes_written,
            bytes_total=report.bytes_written,
            detail=f"exported {len(report.kernels)} kernel revision(s) to {where}",
        ),
    )


def export_stream(
    store: ExportSource,
    specs: Iterable[ExportSpec],
    send: Callable[[FileOp], None],
    *,
    existing: dict[str, bytes] | None = None,
    present_blobs: Iterable[str] = (),
    label: str = "",
    variants: Sequence[str] | None = None,
    sign_keys: Sequence[SigningKey] = (),
    name: str = "",
    progress: ProgressFn | None = None,
) -> ExportReport:
    """Export `specs` as a stream of files (`send`), for a caller who writes them.

    What the daemon runs for `kerneldctl mirror export`: the file the admin asks for is written
    by the admin's own process (`kerneld.mirror.receive`), wherever the admin may write, and
    the daemon never writes a caller-chosen path. `existing` / `present_blobs` describe the
    caller's destination so the export merges into it and sends only what changes; `label`
    names it in the report.
    """
    spec_list = list(specs)
    if not spec_list:
        raise ExportError("nothing to export: name kernels or give a lock file")
    for rel in existing or {}:
        check_doc_rel(rel)
    kernels, refs, skipped = select(store, spec_list, variants)
    report = ExportReport(destination=label, skipped_variants=skipped)
    report.signed_by = [k.name for k in sign_keys]
    target = StreamTarget(existing or {}, present_blobs, send)
    with leased(store, kernels):
        write_export(store, target, kernels, refs, sign_keys, name, report, progress)
    _finished(progress, report, label or "the caller")
    return report
