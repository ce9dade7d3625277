"""What an export takes out of the store: the kernels, commits, variants and refs asked for.

Specs come from kerneldctl's arguments (`ExportSpec.parse`), a lock file (`specs_from_lock`) or
the `MirrorExport` RPC (`specs_from_wire`). `select` turns them into the variant trees to copy,
all of it decided before anything is written (a spec the store cannot satisfy fails the whole
export), and `leased` keeps those trees from GC while they are copied.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kerneld.mirror.destination import ExportError
from kerneld.store import ExportSource
from kerneld.store.manifest import ManifestEntry, parse_manifest
from kerneld.upstream.base import check_repo_id
from kerneld_client.lockfile import LockFile
from kerneld_client.vocabulary import is_commit

_SPEC_RE = re.compile(r"^([^/@:\s]+/[^/@:\s]+)(?::(\d+)|@(\S+))?$")
#: How long the export's leases keep its trees from GC (released when the export ends).
LEASE_S = 6 * 3600.0


@dataclass(frozen=True)
class ExportSpec:
    """A kernel to export.

    `commit` set: that commit (and `ref`, if given, is recorded as pointing at it). Only `ref`
    set: the commit the store's `ref` points at. Neither: every commit of the repo in the store,
    with every store ref that points at one of them.
    """

    repo_id: str
    ref: str | None = None
    commit: str | None = None

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)
        if self.commit is not None and not is_commit(self.commit):
            raise ValueError(f"{self.repo_id}: commit must be 40 lowercase hex: {self.commit!r}")

    @classmethod
    def parse(cls, text: str) -> ExportSpec:
        """`org/name`, `org/name:1` (version 1, branch v1), `org/name@rev` (ref or commit)."""
        m = _SPEC_RE.match(text.strip())
        if not m:
            raise ValueError(
                f"expected 'org/name', 'org/name:VERSION' or 'org/name@REVISION', got {text!r}"
            )
        repo, version, rev = m.group(1), m.group(2), m.group(3)
        if version is not None:
            return cls(repo, ref=f"v{int(version)}")
        if rev is not None and is_commit(rev):
            return cls(repo, commit=rev)
        return cls(repo, ref=rev)

    def __str__(self) -> str:
        return (
            f"{self.repo_id}@{self.commit or self.ref}"
            if self.commit or self.ref
            else (self.repo_id)
        )


def specs_from_lock(lock: LockFile) -> list[ExportSpec]:
    """Export specs for every entry of a lock file (either format) at its locked commit."""
    specs: list[ExportSpec] = []
    for repo_id, commit, ref in lock.pinned():
        if len(commit) != 40:
            raise ExportError(f"{repo_id}: sha256 commit ids are not supported ({commit})")
        specs.append(ExportSpec(repo_id, ref=None if ref == commit else ref, commit=commit))
    return specs


def specs_from_wire(kernels: Iterable[Any], lockfile_json: str = "") -> list[ExportSpec]:
    """The specs of an `Admin.MirrorExport` request.

    A `KernelRef` with no selector means everything the store holds of the repo (as
    `kerneldctl mirror export org/name` does); `version` N the commit of branch vN; `revision` a
    ref or commit; `locked_commit` that commit. `lockfile_json` is a kernels.lock (either format).
    """
    from kerneld_client.lockfile import LockfileError, parse_lockfile

    specs: list[ExportSpec] = []
    for ref in kernels:
        which = ref.WhichOneof("selector")
        if which == "version":
            specs.append(ExportSpec(ref.repo_id, ref=f"v{ref.version}"))
        elif which == "locked_commit":
            specs.append(ExportSpec(ref.repo_id, commit=ref.locked_commit))
        elif which == "revision" and is_commit(ref.revision):
            specs.append(ExportSpec(ref.repo_id, commit=ref.revision))
        elif which == "revision":
            specs.append(ExportSpec(ref.repo_id, ref=ref.revision))
        else:
            specs.append(ExportSpec(ref.repo_id))
    if lockfile_json:
        try:
            specs += specs_from_lock(parse_lockfile(lockfile_json, source="lockfile_json"))
        except LockfileError as exc:
            raise ExportError(str(exc)) from None
    return specs


@dataclass
class SelectedFile:
    """One file of a selected variant, with the id its upstream gave it (a git blob sha1)."""

    entry: ManifestEntry
    upstream_id: str | None


@dataclass
class SelectedKernel:
    """One commit of one kernel to export: its chosen variants' files and their tree digests."""

    repo_id: str
    commit: str
    variants: dict[str, list[SelectedFile]] = field(default_factory=dict)
    trees: list[str] = field(default_factory=list)


def _tree_files(
    store: ExportSource, repo: str, commit: str, variant: str
) -> tuple[str, list[SelectedFile]]:
    tree = store.catalog.published_tree(repo, commit, variant)
    if tree is None:
        raise ExportError(f"{repo}@{commit} [{variant}]: vanished from the store during export")
    ids = store.catalog.upstream_ids(repo, commit, variant)
    files = [SelectedFile(e, ids.get(e.path)) for e in parse_manifest(tree.manifest)]
    return tree.digest, files


def select(
    store: ExportSource, specs: Sequence[ExportSpec], variants: Sequence[str] | None
) -> tuple[dict[tuple[str, str], SelectedKernel], dict[str, dict[str, str]], list[str]]:
    """(kernels by (repo, commit), refs by repo, variants asked for but not in the store).

    ExportError, naming every spec the store cannot satisfy, before anything is written."""
    wanted = None if not variants or list(variants) == ["all"] else list(dict.fromkeys(variants))
    if wanted is not None and ("auto" in wanted or "all" in wanted):
        raise ExportError(
            "an export takes 'all' or variant names (which variants a host runs is decided on "
            "the importing side)"
        )
    kernels: dict[tuple[str, str], SelectedKernel] = {}
    refs: dict[str, dict[str, str]] = {}
    skipped: list[str] = []
    problems: list[str] = []
    for spec in specs:
        repo = spec.repo_id
        if spec.commit is None and spec.ref is None:
            commits = sorted({v.commit for v in store.catalog.variants_of(repo)})
            if not commits:
                problems.append(f"{repo}: nothing of it is in the store (prefetch it first)")
                continue
            for r in store.names.refs_of(repo):
                if r.commit in commits:
                    refs.setdefault(repo, {})[r.ref] = r.commit
        else:
            commit = spec.commit or store.names.resolve_revision(repo, str(spec.ref))
            if commit is None:
                problems.append(
                    f"{spec}: this store does not know that revision (prefetch it first)"
                )
                continue
            commits = [commit]
            if spec.ref is not None and spec.ref != commit:
                refs.setdefault(repo, {})[spec.ref] = commit
        for commit in commits:
            available = store.catalog.variants(repo, commit)
            if not available:
                problems.append(
                    f"{repo}@{commit}: no variant of this commit is in the store "
                    "(prefetch it first)"
                )
                continue
            chosen = available if wanted is None else [v for v in wanted if v in available]
            if wanted is not None:
                skipped += [f"{repo}@{commit} [{v}]" for v in wanted if v not in available]
            if not chosen:
                problems.append(
                    f"{repo}@{commit}: none of the variants {', '.join(wanted or [])} is in "
                    f"the store (it has: {', '.join(available)})"
                )
                continue
            kernel = kernels.setdefault((repo, commit), SelectedKernel(repo, commit))
            for name in chosen:
                if name not in kernel.variants:
                    digest, files = _tree_files(store, repo, commit, name)
                    kernel.variants[name] = files
                    kernel.trees.append(digest)
    if problems:
        raise ExportError("cannot export:\n  " + "\n  ".join(problems))
    return kernels, refs, skipped


@contextmanager
def leased(store: ExportSource, kernels: dict[tuple[str, str], SelectedKernel]) -> Iterator[None]:
    """Keep the exported trees from GC while their files are copied."""
    leases = []
    try:
        if not store.read_only:
            for kernel in kernels.values():
                leases += [
                    store.leases.acquire(t, LEASE_S, holder="mirror-export") for t in kernel.trees
                ]
        yield
    finally:
        for lease in leases:
            store.leases.release(lease.id)
