"""Taking damage out of service: `verify` (``kerneldctl verify``, re-hash everything) with its
repair, and `invalidate` (the scrub's repair). Damaged trees and blobs are marked dead, their
variants lose their rows (clients see a miss, the daemon fetches them again where an upstream
has them) and their files go into the quarantine, never deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from . import verify as verify_mod
from .collector import Collector
from .errors import log_context
from .paths import tree_hex
from .published_index_writer import PublishedIndexWriter
from .quarantine import Quarantine
from .state import StoreState

log = logging.getLogger("kerneld.store")

Invalidated = list[tuple[str, str, str]]
"""(repo, commit, variant) of each variant that lost its tree."""


class Repairer:
    """Verifies the store and takes what is broken out of service."""

    def __init__(
        self,
        state: StoreState,
        *,
        quarantine: Quarantine,
        collector: Collector,
        writer: PublishedIndexWriter,
        owner_uid: int,
    ) -> None:
        self._state = state
        self._quarantine = quarantine
        self._collector = collector
        self._writer = writer
        self._owner_uid = owner_uid

    def verify(
        self,
        *,
        repair: bool = False,
        on_invalidated: Callable[[str, str, str], None] | None = None,
    ) -> verify_mod.VerifyReport:
        """Re-hash every blob and tree; with ``repair`` take whatever is broken out of service.

        Nothing is deleted: a damaged tree or blob may be the only copy (an air-gapped host, an
        upstream that no longer has it), so it is moved into ``v1/quarantine/`` with a note of
        what it was (see `quarantine`). Its variants lose their rows, so the daemon fetches them
        again where an upstream has them; ``on_invalidated(repo, commit, variant)`` is called
        for each. Quarantined entries whose variants are served again are dropped.
        """
        state = self._state
        if repair:
            state.writable()
        report = verify_mod.verify(state.layout, state.index, self._owner_uid)
        if repair:
            self._repair(report, on_invalidated)
            self._quarantine.prune()
        return report

    def _repair(
        self,
        report: verify_mod.VerifyReport,
        on_invalidated: Callable[[str, str, str], None] | None,
    ) -> None:
        bad_blobs = {p.id for p in report.problems if p.object == "blob" and p.kind != "unknown"}
        bad_trees = {p.id for p in report.problems if p.object == "tree" and p.kind != "unknown"}
        unknown = [Path(p.path) for p in report.problems if p.kind == "unknown"]
        with self._state.lock:
            invalidated, kept, _dead = self._take_out(
                bad_blobs, bad_trees, report.problems, "repair"
            )
            for path in unknown:
                if path.parent == self._state.layout.blobs and path.is_dir():
                    continue  # a stray bucket: its files are reported (and moved) one by one
                entry = self._quarantine.add(path, "unknown", path.name, {"why": "not in index"})
                if entry is not None:
                    kept.append(entry)
        self._collector.purge_dead({})
        report.quarantined = kept
        report.repaired.extend(q.describe() for q in kept)
        report.invalidated = invalidated
        for repo, commit, variant in invalidated:
            ctx: dict[str, str | None] = {"repo_id": repo, "commit": commit, "variant": variant}
            log.warning("repair: invalidated %s", log_context(ctx))
            if on_invalidated is not None:
                on_invalidated(repo, commit, variant)

    def invalidate(
        self,
        *,
        trees: Iterable[str] = (),
        blobs: Iterable[str] = (),
        problems: Sequence[verify_mod.Problem] = (),
    ) -> tuple[Invalidated, set[str], list[verify_mod.Quarantined]]:
        """Take damaged trees and blobs out of service at once (the scrub's repair).

        Only rows that are still live are touched, so a tree GC removed (or replaced) while it
        was being checked is left alone. Everything marked dead is quarantined, not deleted
        (see `verify`); clients see the variants disappear from the index (a miss: they ask the
        daemon, which fetches again). Returns the invalidated (repo, commit, variant), the dead
        tree digests and the quarantine entries.
        """
        state, index = self._state, self._state.index
        state.writable()
        with state.lock:
            live_trees = []
            for digest in trees:
                hexd = tree_hex(digest)
                row = index.get_tree(hexd)
                if row is not None and row.state == "live":
                    live_trees.append(hexd)
            live_blobs = []
            for sha in blobs:
                brow = index.get_blob(sha)
                if brow is not None and brow.state == "live":
                    live_blobs.append(sha)
            if not live_trees and not live_blobs:
                return [], set(), []
            invalidated, kept, dead = self._take_out(live_blobs, live_trees, problems, "scrub")
        self._collector.purge_dead({})
        for repo, commit, variant in invalidated:
            ctx: dict[str, str | None] = {"repo_id": repo, "commit": commit, "variant": variant}
            log.warning("invalidated damaged tree %s", log_context(ctx))
        return invalidated, dead, kept

    def _take_out(
        self,
        bad_blobs: Iterable[str],
        bad_trees: Iterable[str],
        problems: Sequence[verify_mod.Problem],
        by: str,
    ) -> tuple[Invalidated, list[verify_mod.Quarantined], set[str]]:
        """Mark blobs and trees dead (and every tree using a dead blob), drop their variant
        rows, republish the published index, then move their files into the quarantine before
        anything can purge them; caller holds the lock."""
        index, layout = self._state.index, self._state.layout
        why: dict[str, list[dict[str, str]]] = {}
        for p in problems:
            why.setdefault(p.id, []).append({"kind": p.kind, "path": p.path, "detail": p.detail})
        trees = set(bad_trees)
        blobs = set(bad_blobs)
        invalidated: Invalidated = []
        used_by: dict[str, list[dict[str, Any]]] = {}
        sizes: dict[str, int] = {}
        with index.tx() as conn:
            for sha in blobs:
                for tree in index.trees_of_blob(sha):
                    if tree not in trees:
                        trees.add(tree)
                        why.setdefault(tree, []).append(
                            {"kind": "uses-damaged-blob", "path": "", "detail": f"blob {sha}"}
                        )
                brow = index.get_blob(sha)
                sizes[sha] = brow.size if brow is not None else 0
                index.set_blob_state(conn, sha, "dead")
            for hexd in trees:
                for v in index.variants_of_tree(hexd):
                    ids = index.upstream_ids(v.repo, v.commit, v.variant)
                    used_by.setdefault(hexd, []).append(
                        {"repo": v.repo, "commit": v.commit, "variant": v.variant, "ids": ids}
                    )
                index.set_tree_state(conn, hexd, "dead")
                for v in index.delete_variants_of_tree(conn, hexd):
                    invalidated.append((v.repo, v.commit, v.variant))
        self._writer.publish({r for r, _c, _v in invalidated})
        kept: list[verify_mod.Quarantined] = []
        for hexd in sorted(trees):
            row = index.get_tree(hexd)
            note: dict[str, Any] = {
                "why": why.get(hexd, []),
                "variants": used_by.get(hexd, []),
                "manifest": row.manifest.decode() if row is not None else "",
                "by": by,
            }
            entry = self._quarantine.add(layout.tree_path(hexd), "tree", hexd, note)
            if entry is not None:
                kept.append(entry)
        for sha in sorted(blobs):
            note = {"why": why.get(sha, []), "size": sizes.get(sha, 0), "by": by}
            entry = self._quarantine.add(layout.blob_path(sha), "blob", sha, note)
            if entry is not None:
                kept.append(entry)
        return invalidated, kept, trees
