"""MirrorExport/MirrorImport: the daemon side of `kerneldctl mirror export/import`.

The work itself lives in `kerneld.mirror` (export/import); this module turns requests into its
calls and its progress into `MirrorEvent`s. If that package is missing from a build, the RPCs
answer UNIMPLEMENTED instead of failing at import time.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from kerneld.server.services.bounds import clip
from kerneld.server.statuses import Unimplemented
from kerneld.store import ExportSource, ImportTarget, ResourceExhaustedError
from kerneld_client.proto import kerneld_pb2 as pb

log = logging.getLogger("kerneld.admin")

Work = Callable[[Callable[[object], None]], None]


class MirrorStore(ImportTarget, ExportSource, Protocol):
    """The store as the mirror RPCs use it: read for an export, written by an import, and a
    scratch file in its work area for an uploaded bundle."""

    def scratch_file(self, name: str) -> AbstractContextManager[Path]: ...


class MirrorSettings(Protocol):
    """The settings an import is checked with: its signers, and the room it leaves."""

    @property
    def trusted_keys(self) -> Mapping[str, str]: ...

    @property
    def min_free_bytes(self) -> int: ...


class VerdictBook(Protocol):
    """Where an import's publisher verdicts go (the daemon's publisher trust)."""

    def record_imported(self, vouched: Mapping[str, str]) -> None: ...


class MirrorHost(Protocol):
    """What the mirror RPCs use of the daemon (the wiring's `Core` implements it)."""

    @property
    def config(self) -> MirrorSettings: ...

    @property
    def store(self) -> MirrorStore: ...

    @property
    def trust(self) -> VerdictBook: ...

    def work(self) -> AbstractContextManager[None]: ...


_KINDS = {
    "manifest": pb.MirrorEvent.MANIFEST,
    "blob": pb.MirrorEvent.BLOB,
    "signature-ok": pb.MirrorEvent.SIGNATURE_OK,
    "refused": pb.MirrorEvent.REFUSED,
    "finished": pb.MirrorEvent.FINISHED,
    "verdict": pb.MirrorEvent.VERDICT,
}


def _event(progress: Any) -> pb.MirrorEvent:
    return pb.MirrorEvent(
        kind=_KINDS.get(progress.kind, pb.MirrorEvent.KIND_UNSPECIFIED),
        repo_id=progress.repo_id,
        commit=progress.commit,
        variant=progress.variant,
        bytes_done=progress.bytes_done,
        bytes_total=progress.bytes_total,
        detail=progress.detail,
        manifests=progress.manifests,
        blobs=progress.blobs,
        skipped_existing=progress.skipped_existing,
    )


#: File data in flight to a slow kerneldctl: at most this many events (DATA events carry up to
#: 1 MiB) wait in the daemon; the export waits for the caller beyond that.
MAX_PENDING_EVENTS = 16

_FILE_KINDS = {
    "file": pb.MirrorEvent.FILE,
    "data": pb.MirrorEvent.DATA,
    "delete": pb.MirrorEvent.DELETE,
}


def export_work(core: MirrorHost, request: pb.MirrorExportRequest) -> Work:
    """Validate the request now (errors fail the RPC before streaming) and return the job.

    The daemon writes nothing for an export: it streams the files (FILE/DATA/DELETE events)
    and kerneldctl writes them as the admin, where the admin asked (the unit's
    ProtectSystem=strict and private /tmp would make any path the daemon wrote wrong)."""
    try:
        from kerneld.mirror.destination import FileOp
        from kerneld.mirror.export import export_stream
        from kerneld.mirror.keys import load_signing_key
        from kerneld.mirror.selection import specs_from_wire
    except ImportError as exc:
        raise Unimplemented(f"mirror export is not available in this build: {exc}") from exc
    store = core.store
    specs = specs_from_wire(request.kernels, request.lockfile_json)
    keys = [load_signing_key(request.sign_key)] if request.sign_key else []
    variants = list(request.variants) or None
    existing = {f.path: bytes(f.data) for f in request.existing}
    label = request.destination or "the caller"
    log.info(
        "admin: mirror export for %s kernels=%s variants=%s signed_by=%s (streamed to the caller)",
        label,
        ",".join(str(s) for s in specs) or "-",
        ",".join(variants or ["all"]),
        request.sign_key or "-",
    )

    def work(emit: Callable[[object], None]) -> None:
        def send(op: FileOp) -> None:
            emit(
                pb.MirrorEvent(
                    kind=_FILE_KINDS[op.kind],
                    path=op.path,
                    bytes_total=op.size,
                    data=op.data,
                )
            )

        with core.work():
            export_stream(
                store,
                specs,
                send,
                existing=existing,
                present_blobs=list(request.present_blobs),
                label=label,
                variants=variants,
                sign_keys=keys,
                progress=lambda p: emit(_event(p)),
            )

    return work


def import_work(core: MirrorHost, request: pb.MirrorImportRequest) -> Work:
    try:
        from kerneld.mirror.import_ import import_mirror
    except ImportError as exc:
        raise Unimplemented(f"mirror import is not available in this build: {exc}") from exc
    store = core.store
    if not request.source:
        raise ValueError("source is required (a mirror directory or a .tar file)")
    if request.no_check_sigs:
        log.warning(
            "admin: mirror import from %s WITHOUT signature checks (no_check_sigs)", request.source
        )
    else:
        log.info("admin: mirror import source=%s", request.source)
    trusted = dict(core.config.trusted_keys)

    def work(emit: Callable[[object], None]) -> None:
        with core.work():
            report = import_mirror(
                store,
                request.source,
                trusted,
                no_check_sigs=request.no_check_sigs,
                progress=lambda p: emit(_event(p)),
                record_verdicts=core.trust.record_imported,
            )
        log.info(
            "admin: mirror import done source=%s imported=%d refused=%d",
            request.source,
            len(report.imported),
            len(report.refused),
        )

    return work


#: How much room an upload leaves on the store's file system beyond `[store] min_free`: the
#: bundle is staged there, and its blobs then need room of their own.
UPLOAD_CHECK_EVERY = 64 << 20


class UploadRefused(ValueError):
    """An upload that cannot be staged (no start message, no room): INVALID_ARGUMENT, or
    RESOURCE_EXHAUSTED for the room (it says which)."""


def upload_work(core: MirrorHost, messages: Iterator[pb.MirrorUpload]) -> Work:
    """`kerneldctl mirror import` of a bundle it sends: staged in the store's work area (its
    own file system; removed afterwards, or at the next open after a crash), then imported as
    a bundle the daemon opened itself. The first message must name it."""
    try:
        from kerneld.mirror.import_ import MirrorImportRefused, import_mirror
    except ImportError as exc:
        raise Unimplemented(f"mirror import is not available in this build: {exc}") from exc
    first = next(messages, None)
    if first is None or not first.HasField("start"):
        raise UploadRefused("the first message of an upload must say what it is (start)")
    request = first.start
    source = clip(request.source or "an uploaded bundle", 200)
    store = core.store
    min_free = core.config.min_free_bytes
    trusted = dict(core.config.trusted_keys)

    def stage(path: Path) -> int:
        size, checked = len(first.data), 0
        with open(path, "wb") as out:
            out.write(first.data)
            for message in messages:
                out.write(message.data)
                size += len(message.data)
                if size - checked >= UPLOAD_CHECK_EVERY:
                    checked = size
                    free = shutil.disk_usage(path.parent).free
                    if free < min_free + UPLOAD_CHECK_EVERY:
                        raise ResourceExhaustedError(
                            size, free, "the store's file system (while staging the upload)"
                        )
        return size

    def work(emit: Callable[[object], None]) -> None:
        with core.work(), store.scratch_file("upload") as path:
            size = stage(path)
            if request.no_check_sigs:
                log.warning(
                    "admin: mirror import of %s (%d bytes, uploaded) WITHOUT signature checks",
                    source,
                    size,
                )
            else:
                log.info("admin: mirror import of %s (%d bytes, uploaded)", source, size)
            try:
                report = import_mirror(
                    store,
                    path,
                    trusted,
                    no_check_sigs=request.no_check_sigs,
                    progress=lambda p: emit(_event(p)),
                    record_verdicts=core.trust.record_imported,
                )
            except MirrorImportRefused as exc:  # in the caller's words: its name, not ours
                message = str(exc).replace(str(path), source)
                log.warning("admin: mirror import of %s refused: %s", source, message)
                raise MirrorImportRefused(message) from None
            except Exception as exc:
                log.warning("admin: mirror import of %s failed: %s", source, exc)
                raise
        log.log(
            logging.WARNING if report.refused else logging.INFO,
            "admin: mirror import done source=%s imported=%d refused=%d",
            source,
            len(report.imported),
            len(report.refused),
        )

    return work
