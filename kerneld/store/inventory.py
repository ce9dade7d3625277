"""What the store holds, kernel by kernel: the one listing behind `Admin.List` and the offline
`kerneldctl ls`/`info` (the daemon turns it into protobuf, the CLI into JSON-ready dicts).

Plain data, computed from the store's public reads only, so a read-only store (the CLI next to
a stopped daemon) gives the same answer as the daemon.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kerneld_client.vocabulary import repo_key

from .deny_rules import COMMIT, REF, REPO, deny_kind, refuses
from .gc import pinned_trees
from .types import ALL, ProvenanceRecord

if TYPE_CHECKING:
    from .interfaces import InventorySource


@dataclass(frozen=True)
class VariantItem:
    variant: str
    tree_digest: str
    path: str
    size_bytes: int
    files: int
    last_resolved: float
    pinned: bool
    """A GC root: kept by a pin on the repo, a ref or commit of it, or this variant."""
    active_leases: int
    provenance: ProvenanceRecord | None


@dataclass
class RevisionItem:
    commit: str
    refs: list[str] = field(default_factory=list)
    variants: list[VariantItem] = field(default_factory=list)
    pinned: bool = False
    """A pin names this commit, or one of its refs, for every variant."""
    denied: bool = False
    """A deny row refuses this commit however it is asked for (`deny_rules`)."""
    denied_by: list[str] = field(default_factory=list)
    """Which rows: "commit", "prefix 6d71a697" (an older kerneld's)."""
    denied_refs: list[str] = field(default_factory=list)
    """Refs of this commit denied by name (`deny --ref`): requests that name them are refused,
    the commit itself is not."""


@dataclass(frozen=True)
class KernelItem:
    repo_id: str
    revisions: list[RevisionItem]
    pinned: bool
    denied: bool


def inventory(store: InventorySource, repos: list[str] | None = None) -> list[KernelItem]:
    """Every kernel of the store (or of `repos`), its commits with their refs, and each
    commit's published variants whose tree is live."""
    now = time.time()
    every_repo = store.names.repos()
    all_variants = [v for r in every_repo for v in store.catalog.variants_of(r)]
    all_refs = store.names.all_refs()
    pins = store.names.pins()
    pinned = pinned_trees(pins, all_refs, all_variants)
    leases: dict[str, int] = {}
    for lease in store.leases.rows():
        if lease.expires_at > now:
            leases[lease.tree] = leases.get(lease.tree, 0) + 1
    wanted = set(repos or [])
    out: list[KernelItem] = []
    for repo in every_repo:
        if wanted and repo not in wanted:
            continue
        refs = store.names.refs_of(repo)
        denies = store.names.denies(repo)
        by_commit: dict[str, RevisionItem] = {}
        for v in store.catalog.variants_of(repo):
            tree = store.catalog.tree(v.tree)
            if tree is None or tree.state != "live":
                continue
            by_commit.setdefault(v.commit, RevisionItem(v.commit)).variants.append(
                VariantItem(
                    variant=v.variant,
                    tree_digest=f"sha256:{v.tree}",
                    path=str(store.catalog.tree_path(v.tree)),
                    size_bytes=tree.size,
                    files=tree.files,
                    last_resolved=tree.last_resolved,
                    pinned=v.tree in pinned,
                    active_leases=leases.get(v.tree, 0),
                    provenance=store.signatures.record_of(v.tree),
                )
            )
        for r in refs:
            by_commit.setdefault(r.commit, RevisionItem(r.commit)).refs.append(r.ref)
        ref_commit = {r.ref: r.commit for r in refs}
        key = repo_key(repo)
        for p in pins:
            if repo_key(p.repo) == key and p.revision != ALL and p.variant == ALL:
                commit = ref_commit.get(p.revision, p.revision)
                if commit in by_commit:
                    by_commit[commit].pinned = True
        for d in denies:
            kind = deny_kind(d.revision)
            for rev in by_commit.values() if kind != REPO else ():
                if kind == REF:
                    if d.revision in rev.refs:
                        rev.denied_refs.append(d.revision)
                elif refuses(d.revision, rev.commit, rev.commit):
                    rev.denied = True
                    rev.denied_by.append(kind if kind == COMMIT else f"{kind} {d.revision}")
        revisions = sorted(by_commit.values(), key=lambda r: r.commit)
        for rev in revisions:
            rev.refs.sort()
            rev.variants.sort(key=lambda v: v.variant)
        out.append(
            KernelItem(
                repo_id=repo,
                revisions=revisions,
                pinned=any(repo_key(p.repo) == key and p.revision == ALL for p in pins),
                denied=any(d.revision == ALL for d in denies),
            )
        )
    return out
