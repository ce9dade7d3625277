"""Running garbage collection (``gc`` plans it): expire leases, take one index snapshot, mark
the plan's victims dead in one short transaction, republish the published index, then delete
their files outside the lock. Dead rows are purged the same way after recovery and repair.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from . import faults
from . import gc as gc_mod
from .holds import Holds
from .layout import fsync_dir
from .locks import Probe
from .paths import tree_hex
from .space import Space
from .state import StoreState
from .trees import remove_tree, unseal_top
from .types import VariantRow

log = logging.getLogger("kerneld.store")


class Collector:
    """Collects garbage (`collect`) and deletes what is dead (`purge_dead`)."""

    def __init__(
        self,
        state: StoreState,
        space: Space,
        holds: Holds,
        republish: Callable[[Iterable[str]], None],
    ) -> None:
        self._state = state
        self._space = space
        self._holds = holds
        self._republish = republish
        self._guards: list[Callable[[], Iterable[str]]] = []

    def guard(self, trees: Callable[[], Iterable[str]]) -> None:
        """Let GC ask ``trees()`` (digests, ``sha256:`` or bare hex) for trees to keep: leases
        the daemon granted but has not written yet. It is called under the store lock, so it
        must not call back into the store."""
        self._guards.append(trees)

    @property
    def policy(self) -> gc_mod.GcPolicy:
        """The GC policy; callers replace it for one collection with a target."""
        return self._state.policy

    @policy.setter
    def policy(self, policy: gc_mod.GcPolicy) -> None:
        self._state.policy = policy

    def collect(self, *, dry_run: bool = False, extra_bytes: int = 0) -> gc_mod.GcReport:
        """Collect garbage and, under pressure, evict least-recently-resolved trees; ``dry_run``
        reports what would be freed and why each tree is kept, changing nothing.
        ``extra_bytes`` is a reservation that has to fit afterwards (then the plan is all or
        nothing)."""
        state, index = self._state, self._state.index
        if not dry_run:
            state.writable()
        now = time.time()
        with state.lock:
            expired = 0
            if not dry_run:
                with index.tx() as conn:
                    expired = index.delete_expired_leases(conn, now)
            trees = index.trees("live", manifests=False)
            blobs = index.blobs("live")
            tree_files: dict[str, list[str]] = {}
            for digest, blob in index.all_tree_files():
                tree_files.setdefault(digest, []).append(blob)
            variants = index.all_variants()
            leased = {lease.tree for lease in index.leases() if lease.expires_at > now}
            held = self._held_trees(variants)
            usage = index.usage() + self._space.reserved + extra_bytes
            free = self._space.free_bytes() - self._space.reserved - extra_bytes
            plan = gc_mod.plan(
                layout=state.layout,
                policy=state.policy,
                now=now,
                trees=trees,
                blobs=blobs,
                tree_files=tree_files,
                variants=variants,
                pins=index.pins(),
                refs=index.all_refs(),
                leased=leased,
                held=held,
                usage=usage,
                free=free,
                all_or_nothing=extra_bytes > 0,
            )
            plan.report.leases_expired = expired
            plan.report.dry_run = dry_run
            if dry_run:
                plan.release()
                return plan.report
            victims = plan.report.deleted_trees
            repos: set[str] = set()
            with index.tx() as conn:
                for t in victims:
                    index.set_tree_state(conn, t.digest, "dead")
                    for v in index.delete_variants_of_tree(conn, t.digest):
                        repos.add(v.repo)
                for sha in plan.report.blobs_deleted:
                    index.set_blob_state(conn, sha, "dead")
            faults.point("gc.marked")
            self._republish(repos)
        for t in victims:
            log.info(
                "gc: deleting tree sha256:%s (%s, %d bytes) %s",
                t.digest,
                t.reason,
                t.bytes_freed,
                " ".join(f"{r}@{c}/{v}" for r, c, v in t.variants),
            )
        self.purge_dead(plan.probes)
        plan.release()
        log.info(
            "gc: freed %d bytes (%d trees, %d blobs); usage %d -> %d",
            plan.report.bytes_freed,
            len(victims),
            len(plan.report.blobs_deleted),
            plan.report.usage_before,
            plan.report.usage_after,
        )
        return plan.report

    def _held_trees(self, variants: Sequence[VariantRow]) -> set[str]:
        """Trees that open holds name, and trees the guards vouch for (bare hex)."""
        names = self._holds.held()
        held = {v.tree for v in variants if (v.repo, v.commit, v.variant) in names}
        for guard in self._guards:
            held.update(tree_hex(t) for t in guard())
        return held

    def purge_dead(self, probes: dict[str, Probe]) -> None:
        """Delete the files of dead rows, then the rows (short lock holds, batched)."""
        state, index, layout = self._state, self._state.index, self._state.layout
        while True:
            with state.lock:
                # One batch of digests per round (loading every dead row, manifests and all,
                # each round made purging 1,000 trees in a 100,000-tree store take 1.8 s).
                rows = index.tree_digests("dead", limit=64)
                if not rows:
                    break
                for hexd in rows:
                    self.move_to_trash(layout.tree_path(hexd))
                    faults.point("gc.tree_moved")
                    layout.lock_path(hexd).unlink(missing_ok=True)
                    probe = probes.pop(hexd, None)
                    if probe is not None:
                        probe.release()
                with index.tx() as conn:
                    for hexd in rows:
                        index.delete_tree(conn, hexd)
            self.empty_trash()
        while True:
            with state.lock:
                dead = index.blob_digests("dead", limit=512)
                if not dead:
                    break
                buckets = set()
                for sha in dead:
                    path = layout.blob_path(sha)
                    path.unlink(missing_ok=True)
                    buckets.add(path.parent)
                    faults.point("gc.blob_unlinked")
                for bucket in buckets:
                    if bucket.is_dir():
                        fsync_dir(bucket)
                with index.tx() as conn:
                    for sha in dead:
                        index.delete_blob(conn, sha)

    def move_to_trash(self, path: Path) -> None:
        if not os.path.lexists(path):
            return
        unseal_top(path)  # renaming a directory needs write permission on it (trees.py)
        os.rename(path, self._state.layout.trash / os.urandom(8).hex())
        fsync_dir(path.parent)

    def empty_trash(self) -> None:
        for child in list(self._state.layout.trash.iterdir()):
            remove_tree(child)
