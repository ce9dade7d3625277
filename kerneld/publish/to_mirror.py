"""Publish into a mirror directory (or `.tar`), merged as `kerneldctl mirror export` merges.

Everything the mirror will hold is decided before anything is written (`_plan_mirror`): the
merged manifest (a variant already there with other files is refused), the refs (each move
checked by `plan_ref`), and whether a signed document would lose its signature. The writes then
follow an export's order and signing (`kerneld.mirror.writing`): info, blobs, the manifest,
then the refs; a `.tar` destination is staged and packed as an export's is.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kerneld.mirror.destination import DirTarget, ExportError, copy_blob_into
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
from kerneld.mirror.keys import SigningKey, sig_path
from kerneld.mirror.tarball import is_tar_destination, pack_tar, unpack_existing
from kerneld.mirror.writing import write_signed
from kerneld.publish import PublishError, immutable
from kerneld.publish.build import LocalFile, LocalVariant, open_regular
from kerneld.publish.refs import Ancestry, plan_ref
from kerneld.publish.report import PublishReport
from kerneld.upstream.base import RemoteFile


def _same_files(variant: LocalVariant, files: Sequence[RemoteFile], execs: frozenset[str]) -> bool:
    have = {(f.path, f.size, f.sha256, f.executable) for f in variant.files}
    there = {(f.path, f.size, f.sha256, f.path in execs) for f in files}
    return have == there


def _copy_blob(root: Path, f: LocalFile) -> int:
    """Copy one build file into the mirror's blobs, re-hashing it (it must not have changed since
    it was checked); atomic, as every mirror file."""

    def unchanged(digest: str, size: int) -> None:
        if digest != f.sha256 or size != f.size:
            raise PublishError(
                f"{f.source} changed while it was being published; no manifest names it",
                hint="publish again once the build has finished",
            )

    with open_regular(f.source) as src:
        return copy_blob_into(root, f.sha256, src, unchanged)


@dataclass
class _MirrorPlan:
    manifest_rel: str
    manifest: bytes
    refs_rel: str
    refs: bytes
    write_info: bool


def _plan_mirror(
    target: DirTarget,
    variants: Sequence[LocalVariant],
    repo_id: str,
    commit: str,
    refs: Sequence[str],
    ancestry: Ancestry | None,
    *,
    force_refs: bool,
    signing: bool,
    report: PublishReport,
) -> _MirrorPlan:
    """Everything the mirror will hold for this publish, decided before anything is written."""
    where = f"the mirror {report.destination}"
    info = target.read(INFO)
    if info is not None:
        try:
            parse_info(info)
        except MirrorFormatError as exc:
            raise PublishError(f"{report.destination}: {exc}") from None

    new = Manifest(
        repo_id,
        commit,
        {v.name: [RemoteFile(f.path, f.size, sha256=f.sha256) for f in v.files] for v in variants},
        {
            v.name: frozenset(f.path for f in v.files if f.executable)
            for v in variants
            if any(f.executable for f in v.files)
        },
    )
    m_rel = manifest_path(repo_id, commit)
    old_raw = target.read(m_rel)
    merged = new
    if old_raw is not None:
        try:
            old = Manifest.from_json(old_raw, repo_id=repo_id, commit=commit)
        except MirrorFormatError as exc:
            raise PublishError(
                f"{where} holds a manifest of {repo_id}@{commit} that cannot be read: {exc}",
                hint=f"remove {m_rel} from the mirror, or publish into another mirror",
            ) from None
        for v in variants:
            if v.name in old.variants:
                if not _same_files(
                    v, old.variants[v.name], old.executables.get(v.name, frozenset())
                ):
                    raise immutable(repo_id, commit, v.name, where)
                report.unchanged.append(v.name)
        execs = {k: s for k, s in old.executables.items() if k not in new.variants}
        execs.update(new.executables)
        merged = Manifest(repo_id, commit, {**old.variants, **new.variants}, execs)

    r_rel = refs_path(repo_id)
    old_refs = target.read(r_rel)
    branches: dict[str, str] = {}
    tags: dict[str, str] = {}
    if old_refs is not None:
        try:
            branches, tags = parse_refs(old_refs, repo_id)
        except MirrorFormatError as exc:
            raise PublishError(
                f"{where} holds refs of {repo_id} that cannot be read: {exc}",
                hint=f"remove {r_rel} from the mirror, or publish into another mirror",
            ) from None
    before = (dict(branches), dict(tags))
    for ref in refs:
        table = tags if ref in tags else branches
        move = plan_ref(ref, table.get(ref), commit, ancestry, force=force_refs)
        report.refs.append(move)
        table[ref] = commit
    unchanged = old_refs is not None and (branches, tags) == before
    if unchanged and old_refs is not None and parse_refs_exported_at(old_refs) is not None:
        refs_data = old_refs  # unchanged: keep the bytes, and the signatures made of them
    else:
        refs_data = refs_json(repo_id, branches, tags, time.time())

    manifest_data = merged.to_json()
    if not signing:
        for rel, was, data in ((m_rel, old_raw, manifest_data), (r_rel, old_refs, refs_data)):
            if was != data and target.read(sig_path(rel)) is not None:
                raise PublishError(
                    f"{where} signs {rel}; publishing without a key would leave it unsigned, "
                    "and daemons that require signatures would stop serving "
                    f"{repo_id}",
                    hint="sign with the mirror's key: --sign-key NAME (and --key-dir DIR)",
                )
    return _MirrorPlan(m_rel, manifest_data, r_rel, refs_data, info is None)


@contextmanager
def _mirror_root(dest: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """The directory to write (a `.tar` destination: a staging directory beside it, seeded with
    the tar's contents) and the call that makes it final."""
    if not is_tar_destination(dest):
        yield dest, lambda: None
        return
    if dest.is_dir():
        raise PublishError(f"{dest} is a directory; a .tar destination must be a file")
    if not dest.parent.is_dir():
        raise PublishError(f"{dest.parent} does not exist: create the directory first")
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.staging-"))
    try:
        if dest.exists():
            try:
                unpack_existing(dest, staging)
            except ExportError as exc:
                raise PublishError(str(exc)) from None
        yield staging, lambda: pack_tar(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_to_mirror(
    variants: Sequence[LocalVariant],
    dest: Path,
    *,
    repo_id: str,
    commit: str,
    refs: Sequence[str] = (),
    ancestry: Ancestry | None = None,
    force_refs: bool = False,
    sign_keys: Sequence[SigningKey] = (),
    name: str = "",
) -> PublishReport:
    """Add the checked `variants` of `repo_id@commit` to the mirror directory (or `.tar`) `dest`.

    An existing mirror is extended: its other kernels, commits and variants stay, refs merge,
    and an unchanged document keeps its bytes and only gains signatures. `refs` point at
    `commit` (forward only unless `force_refs`, see `plan_ref`). PublishError before any write
    when the build, the refs or the mirror forbid it.
    """
    report = PublishReport(repo_id, commit, str(dest), "mirror", list(variants), [])
    report.signed_by = [k.name for k in sign_keys]
    with _mirror_root(dest) as (root, finish):
        try:
            target = DirTarget(root, name)
        except ExportError as exc:
            raise PublishError(str(exc)) from None
        plan = _plan_mirror(
            target,
            variants,
            repo_id,
            commit,
            refs,
            ancestry,
            force_refs=force_refs,
            signing=bool(sign_keys),
            report=report,
        )
        # Writes, in the order an export writes: info, blobs, the manifest, then the refs.
        if plan.write_info:
            target.write(INFO, info_json(name))
        blobs = {f.sha256: f for v in variants for f in v.files}
        for sha, f in sorted(blobs.items()):
            if target.has_blob(sha, f.size):
                report.blobs_present += 1
                continue
            report.bytes_written += _copy_blob(root, f)
            report.blobs_written += 1
        write_signed(target, plan.manifest_rel, plan.manifest, sign_keys)
        write_signed(target, plan.refs_rel, plan.refs, sign_keys)
        finish()
    return report
