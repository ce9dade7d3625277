"""Garbage collection planning: which trees and blobs to delete, and why the rest are kept.

Roots (never deleted): pinned trees, trees under an unexpired lease, trees whose lock file some
process holds (``LOCK_EX | LOCK_NB`` fails), and trees resolved within ``min_age_s``.

Always collected: trees no (repo, commit, variant) points to any more, and blobs no tree uses
(after ``orphan_grace_s``, which protects blobs ingested for a publish still in progress).
Under pressure — usage above ``cap_bytes * target_fraction`` or free space below
``free_target_bytes`` — the least recently resolved trees go first until the pressure is gone.

The plan is computed from one index snapshot; the collector (``collector``) then marks the
victims dead in one short transaction and deletes files outside it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from kerneld_client.vocabulary import repo_key

from .layout import Layout
from .locks import Probe, try_lock_exclusive
from .types import ALL, BlobRow, PinRow, RefRow, TreeRow, VariantRow

log = logging.getLogger("kerneld.store.gc")


@dataclass(frozen=True)
class GcPolicy:
    cap_bytes: int | None = None
    """Upper bound on the bytes the store may occupy (None: no cap)."""
    min_free_bytes: int = 0
    """Low watermark: no write may leave the file system with less free space than this."""
    free_target_bytes: int | None = None
    """GC evicts until at least this much is free (default: twice ``min_free_bytes``)."""
    target_fraction: float = 0.9
    """GC evicts until usage is at most this fraction of the cap."""
    min_age_s: float = 3600.0
    """Trees resolved more recently than this are never evicted."""
    orphan_grace_s: float = 3600.0
    """Blobs are never deleted within this long of their ingest or of their last claim
    (``has_blob``/``find_blob`` hit): a publish that uses them may be coming."""


@dataclass
class TreeDecision:
    digest: str
    action: str
    """``delete`` or ``keep``."""
    reason: str
    """Why: pinned, leased, held, in-use (lock held), recent, unreferenced, evicted (lru), ..."""
    bytes_freed: int
    last_resolved: float
    variants: list[tuple[str, str, str]] = field(default_factory=list)
    size_bytes: int = 0
    """The tree's size (its files' bytes), kept or not: what an admin weighs against a target."""


@dataclass
class GcReport:
    dry_run: bool
    usage_before: int
    usage_after: int
    free_before: int
    bytes_freed: int
    trees: list[TreeDecision]
    blobs_deleted: list[str]
    leases_expired: int = 0

    @property
    def deleted_trees(self) -> list[TreeDecision]:
        return [t for t in self.trees if t.action == "delete"]

    @property
    def kept_trees(self) -> list[TreeDecision]:
        return [t for t in self.trees if t.action == "keep"]


@dataclass
class GcPlan:
    report: GcReport
    probes: dict[str, Probe]
    """LOCK_EX probes held on victim trees until they are gone."""

    def release(self) -> None:
        for probe in self.probes.values():
            probe.release()
        self.probes.clear()


def pinned_trees(
    pins: list[PinRow], refs: list[RefRow], variants: list[VariantRow]
) -> dict[str, str]:
    """Tree digests reachable from pins, with the pin that holds each. A pin holds its repo
    in every spelling (the Hub resolves repo ids case-insensitively)."""
    commits_of: dict[tuple[str, str], set[str]] = {}
    for r in refs:
        commits_of.setdefault((repo_key(r.repo), r.ref), set()).add(r.commit)
    out: dict[str, str] = {}
    for pin in pins:
        key = repo_key(pin.repo)
        commits = {pin.revision}
        if pin.revision != ALL:
            commits = commits_of.get((key, pin.revision), commits)
        for v in variants:
            if repo_key(v.repo) != key:
                continue
            if pin.revision != ALL and v.commit not in commits:
                continue
            if pin.variant not in (ALL, v.variant):
                continue
            out.setdefault(v.tree, f"pinned ({pin.repo}@{pin.revision}/{pin.variant})")
    return out


def plan(
    *,
    layout: Layout,
    policy: GcPolicy,
    now: float,
    trees: list[TreeRow],
    blobs: list[BlobRow],
    tree_files: dict[str, list[str]],
    variants: list[VariantRow],
    pins: list[PinRow],
    refs: list[RefRow],
    leased: set[str],
    usage: int,
    free: int,
    all_or_nothing: bool = False,
    held: AbstractSet[str] = frozenset(),
) -> GcPlan:
    """Decide what to delete. With ``all_or_nothing`` (GC on behalf of a reservation) no tree is
    evicted unless evicting every candidate would relieve the pressure: evicting caches for a
    write that fails anyway helps nobody."""
    pinned = pinned_trees(pins, refs, variants)
    names: dict[str, list[tuple[str, str, str]]] = {}
    for v in variants:
        names.setdefault(v.tree, []).append((v.repo, v.commit, v.variant))
    refcount: Counter[str] = Counter()
    for t in trees:
        for blob in set(tree_files.get(t.digest, [])):
            refcount[blob] += 1
    blob_size = {b.sha256: b.size for b in blobs}
    young = {b.sha256 for b in blobs if b.created_at >= now - policy.orphan_grace_s}

    need = 0
    if policy.cap_bytes is not None:
        need = max(need, usage - int(policy.cap_bytes * policy.target_fraction))
    free_target = (
        policy.free_target_bytes
        if policy.free_target_bytes is not None
        else 2 * policy.min_free_bytes
    )
    need = max(need, free_target - free)

    decisions: list[TreeDecision] = []
    probes: dict[str, Probe] = {}
    freed_total = 0
    deleted_trees: set[str] = set()

    def freed_by(tree: TreeRow) -> int:
        total = tree.copied_bytes
        for blob in set(tree_files.get(tree.digest, [])):
            if refcount[blob] == 1 and blob not in young:
                total += blob_size.get(blob, 0)
        return total

    def root_reason(tree: TreeRow, *, unreferenced: bool) -> str | None:
        if tree.digest in pinned:
            return pinned[tree.digest]
        if tree.digest in leased:
            return "leased"
        if tree.digest in held:
            return "held (a request in flight is fetching or serving it)"
        if not unreferenced and tree.last_resolved >= now - policy.min_age_s:
            return f"recent (resolved within {policy.min_age_s:g}s)"
        return None

    def take(tree: TreeRow, reason: str) -> bool:
        probe = try_lock_exclusive(layout.lock_path(tree.digest))
        if probe.held:
            decisions.append(
                TreeDecision(
                    tree.digest,
                    "keep",
                    "in use (a process holds its lock)",
                    0,
                    tree.last_resolved,
                    names.get(tree.digest, []),
                    tree.size,
                )
            )
            return False
        probes[tree.digest] = probe
        freed = freed_by(tree)
        for blob in set(tree_files.get(tree.digest, [])):
            refcount[blob] -= 1
        deleted_trees.add(tree.digest)
        decisions.append(
            TreeDecision(
                tree.digest,
                "delete",
                reason,
                freed,
                tree.last_resolved,
                names.get(tree.digest, []),
                tree.size,
            )
        )
        return True

    candidates = []
    for tree in sorted(trees, key=lambda t: (t.last_resolved, t.digest)):
        unreferenced = tree.digest not in names
        why_keep = root_reason(tree, unreferenced=unreferenced)
        if why_keep is not None:
            decisions.append(
                TreeDecision(
                    tree.digest,
                    "keep",
                    why_keep,
                    0,
                    tree.last_resolved,
                    names.get(tree.digest, []),
                    tree.size,
                )
            )
        elif unreferenced:
            before = freed_by(tree)
            if take(tree, "unreferenced (no repo/commit/variant points to it)"):
                freed_total += before
        else:
            candidates.append(tree)
    if all_or_nothing and candidates and freed_total < need:
        scratch = Counter(refcount)
        potential = freed_total
        for tree in candidates:
            potential += tree.copied_bytes
            for blob in set(tree_files.get(tree.digest, [])):
                scratch[blob] -= 1
                if scratch[blob] == 0 and blob not in young:
                    potential += blob_size.get(blob, 0)
        if potential < need:
            need = 0
    for tree in candidates:
        if freed_total >= need:
            decisions.append(
                TreeDecision(
                    tree.digest,
                    "keep",
                    "not needed (usage within the cap and watermarks)",
                    0,
                    tree.last_resolved,
                    names.get(tree.digest, []),
                    tree.size,
                )
            )
            continue
        before = freed_by(tree)
        if take(tree, "evicted (least recently resolved, over quota)"):
            freed_total += before

    victim_blobs: set[str] = set()
    for d in deleted_trees:
        victim_blobs.update(tree_files.get(d, []))
    orphans = []
    for b in blobs:
        if refcount[b.sha256] > 0 or b.sha256 in young:
            continue
        orphans.append(b.sha256)
        if b.sha256 not in victim_blobs:
            freed_total += b.size
    report = GcReport(
        dry_run=False,
        usage_before=usage,
        usage_after=usage - freed_total,
        free_before=free,
        bytes_freed=freed_total,
        trees=decisions,
        blobs_deleted=orphans,
    )
    return GcPlan(report=report, probes=probes)
