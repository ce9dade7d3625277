"""Finding a published tree: (repo, ref-or-commit, variant) to a live tree the caller may use,
refused when the repo or revision is denied (or, while signatures are required, the tree is not
verified), with its resolve time recorded (LRU) and, if asked, a lease taken on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .leasing import Lease, LeaseManager
from .manifest import parse_manifest
from .names import Names
from .paths import tree_hex, validate_ref, validate_repo
from .signatures import Signatures
from .state import StoreState
from .types import TreeRow, VariantRow


@dataclass(frozen=True)
class LookupHit:
    """A published tree `store.catalog.lookup` found for (repo, revision, variant)."""

    repo: str
    commit: str
    variant: str
    digest: str
    path: Path
    lock_path: Path
    metadata_id: str | None
    backend: str | None
    archs: list[str]
    lease: Lease | None = None


@dataclass(frozen=True)
class PublishedFile:
    """One file of a published variant: its manifest line and the upstream's id for it (an
    LFS sha256 or a git blob sha1; None for a tree that came without one, a mirror import)."""

    path: str
    size: int
    sha256: str
    mode: int
    upstream_id: str | None


class Lookups:
    """Answers which live tree a (repo, revision, variant) names, and what it holds."""

    def __init__(
        self, state: StoreState, names: Names, signatures: Signatures, leases: LeaseManager
    ) -> None:
        self._state = state
        self._names = names
        self._signatures = signatures
        self._leases = leases

    def lookup(
        self,
        repo: str,
        revision: str,
        variant: str,
        *,
        lease_ttl_s: float | None = None,
        holder: str = "",
    ) -> LookupHit | None:
        """`store.catalog.lookup`: a signature check first if required (outside the lock), then
        under the lock the ref, the denies, the live tree, its LRU time and the lease."""
        validate_repo(repo)
        validate_ref(revision, repo_id=repo)
        state, index, layout = self._state, self._state.index, self._state.layout
        if state.require_signed:  # not under the lock: the first check imports sigstore
            self._signatures.check_unrecorded(repo, revision, variant)
        with state.lock:
            commit = self._names.resolve_revision(repo, revision)
            self._names.check_denied(repo, revision, commit)
            if commit is None:
                return None
            row = index.get_variant(repo, commit, variant)
            if row is None:
                return None
            tree = index.get_tree(row.tree)
            if tree is None or tree.state != "live":
                return None
            if state.require_signed:
                self._signatures.refuse_unverified(
                    tree.digest, repo_id=repo, commit=commit, variant=variant
                )
            if not state.read_only:
                index.touch_tree(tree.digest, time.time())
            lease = None
            if lease_ttl_s is not None:
                lease = self._leases.acquire(tree.digest, lease_ttl_s, holder=holder)
            return LookupHit(
                repo=repo,
                commit=commit,
                variant=variant,
                digest=f"sha256:{tree.digest}",
                path=layout.tree_path(tree.digest),
                lock_path=layout.lock_path(tree.digest),
                metadata_id=tree.metadata_id,
                backend=tree.backend,
                archs=tree.archs,
                lease=lease,
            )

    def published_tree(self, repo: str, commit: str, variant: str) -> TreeRow | None:
        """The live tree `repo`@`commit` publishes as `variant` (None: not in the store)."""
        index = self._state.index
        row = index.get_variant(repo, commit, variant)
        tree = None if row is None else index.get_tree(row.tree)
        return tree if tree is not None and tree.state == "live" else None

    def published_files(
        self, repo: str, commit: str, variant: str
    ) -> tuple[Path, list[PublishedFile]] | None:
        """(tree path, files) of a published variant: the tree handed out, so the provenance
        gate applies as in `lookup` (ProvenanceError for an unverified tree while signatures
        are required, for every caller); None when the variant is not here."""
        state = self._state
        if state.require_signed:  # not under the lock: the first check imports sigstore
            self._signatures.check_unrecorded(repo, commit, variant)
        with state.lock:
            tree = self.published_tree(repo, commit, variant)
            if tree is None:
                return None
            if state.require_signed:
                self._signatures.refuse_unverified(
                    tree.digest, repo_id=repo, commit=commit, variant=variant
                )
            ids = state.index.upstream_ids(repo, commit, variant)
        return state.layout.tree_path(tree.digest), _files(tree, ids)

    def published_listing(self, repo: str, commit: str, variant: str) -> list[PublishedFile] | None:
        """What a published variant holds (names, sizes, ids), without its path: a listing
        hands out no code, so it shows a tree the provenance gate would refuse to hand out
        (its bytes are refused, with the reason, when asked for); None when not here."""
        with self._state.lock:
            tree = self.published_tree(repo, commit, variant)
            if tree is None:
                return None
            ids = self._state.index.upstream_ids(repo, commit, variant)
        return _files(tree, ids)

    # ---- what the store holds, read from the index ----

    def variants(self, repo: str, commit: str) -> list[str]:
        """Published variant names of a commit."""
        return [v.variant for v in self._state.index.variants_of(repo, commit)]

    def variants_of(self, repo: str, commit: str | None = None) -> list[VariantRow]:
        """The published variants of `repo` (of one commit), live trees or not."""
        return self._state.index.variants_of(repo, commit)

    def variants_of_tree(self, digest: str) -> list[VariantRow]:
        """Every (repo, commit, variant) that publishes this tree."""
        return self._state.index.variants_of_tree(tree_hex(digest))

    def tree(self, digest: str) -> TreeRow | None:
        """A tree's row (any state; None: unknown)."""
        return self._state.index.get_tree(tree_hex(digest))

    def tree_path(self, digest: str) -> Path:
        """The folder of a tree (``sha256:<hex>`` or hex), whether or not it is live."""
        return self._state.layout.tree_path(tree_hex(digest))

    def upstream_ids(self, repo: str, commit: str, variant: str) -> dict[str, str]:
        """The ids the upstream announced for each file (LFS sha256 or git blob sha1)."""
        return self._state.index.upstream_ids(repo, commit, variant)

    def live_tree_digests(self) -> list[str]:
        """Hex digests of every live tree, sorted (the scrub walks them in this order)."""
        return self._state.index.tree_digests("live")


def _files(tree: TreeRow, ids: dict[str, str]) -> list[PublishedFile]:
    return [
        PublishedFile(e.path, e.size, e.sha256, e.mode, ids.get(e.path))
        for e in parse_manifest(tree.manifest)
    ]
