"""Writing the published index (``published_index`` has its format): every change a resolution
depends on (refs, variants, denies, GC, repair) rewrites the files of the repos it touched and
bumps the store-wide generation, so the daemon can tell cheaply whether anything moved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kerneld_client.variants import PlatformFacts

from . import faults, published_index
from .picks import Picker
from .state import StoreState

#: Repos whose documents one step of a republish rewrites while holding the store's lock, and
#: the pause between steps.
_REPUBLISH_BATCH = 2
_REPUBLISH_PAUSE_S = 0.002


class PublishedIndexWriter:
    """Rewrites ``index/v1``: a repo's document, ``denies.json`` and store-wide documents."""

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self.generation = int(state.index.get_meta("generation") or 0)
        """The published index generation: bumped by every change a resolution depends on (refs,
        variants, denies, GC, repair), so the daemon can tell cheaply whether anything moved."""

    @property
    def directory(self) -> Path:
        """Where the published index lives (``index/v1``), for the status RPC."""
        return self._state.layout.published_index

    def publish(
        self, repos: Iterable[str], *, denies: bool = False, skip_unchanged: bool = False
    ) -> None:
        """Rewrite the published index files of ``repos`` (caller holds the lock or is alone).

        ``skip_unchanged`` (the check at every open) leaves files that already say the same
        alone: rewriting each with two fsyncs made a restart with 100,000 trees take a minute.
        """
        repos = sorted(set(repos))
        if not repos and not denies:
            return
        state = self._state
        index, layout = state.index, state.layout
        with state.lock:
            with index.tx() as conn:
                generation = index.next_generation(conn)
            self.generation = generation
            for repo in repos:
                path = layout.repo_index_path(repo)
                doc = published_index.build_repo_doc(
                    index,
                    layout,
                    repo,
                    generation,
                    require_signed=state.require_signed,
                    picker=state.picker,
                )
                if not doc["refs"] and not doc["commits"] and not doc["denies"]:
                    published_index.remove(path)
                elif not (skip_unchanged and published_index.unchanged(path, doc)):
                    published_index.atomic_write_json(path, doc)
            if denies:
                path = layout.published_index / "denies.json"
                doc = published_index.build_denies_doc(index, generation)
                if not (skip_unchanged and published_index.unchanged(path, doc)):
                    published_index.atomic_write_json(path, doc)
        faults.point("index.published")

    def set_platforms(self, platforms: Iterable[PlatformFacts]) -> None:
        """Publish the picks of these platforms (those clients showed) instead of the current
        ones; every repo's document is rewritten when the set of fingerprints changed."""
        picker = Picker(platforms)
        state = self._state
        with state.lock:
            if picker.platforms.keys() == state.picker.platforms.keys():
                return
            state.picker = picker
            if state.read_only or state.closed:
                return
            repos = state.index.repos()
        # A few repos at a time, pausing in between so that a waiting lookup or fetch takes the
        # store's lock (released and at once re-taken, it went to this loop again: the first
        # Resolve of a new platform waited 5.4 s for 1,000 documents in a 100,000-tree store).
        for start in range(0, len(repos), _REPUBLISH_BATCH):
            if start:
                time.sleep(_REPUBLISH_PAUSE_S)
            with state.lock:
                if state.closed or state.picker is not picker:
                    return  # closing, or newer platforms: their own pass rewrites
                self.publish(repos[start : start + _REPUBLISH_BATCH], skip_unchanged=True)

    def rebuild(self) -> None:
        """Drop the files of repos the index no longer knows and rewrite those that differ
        (at every read-write open, after recovery)."""
        repos = set(self._state.index.repos())
        base = self._state.layout.published_index
        for org_dir in list(base.iterdir()) if base.is_dir() else []:
            if not org_dir.is_dir():
                continue
            for f in list(org_dir.iterdir()):
                if f.suffix == ".json" and f"{org_dir.name}/{f.stem}" not in repos:
                    published_index.remove(f)
        self.publish(repos, denies=True, skip_unchanged=True)

    def publish_document(self, name: str, doc: dict[str, Any]) -> None:
        """Write a store-wide document next to the published index (`index/v1/<name>`), for
        readers of the warm path; unchanged content is not rewritten."""
        if "/" in name or name.startswith(".") or not name.endswith(".json"):
            raise ValueError(f"not a document name: {name!r}")
        path = self._state.layout.published_index / name
        with self._state.lock:
            if not published_index.unchanged(path, doc):
                published_index.atomic_write_json(path, doc)

    def read_document(self, name: str) -> dict[str, Any] | None:
        """A document `publish_document` wrote (None if missing or unreadable)."""
        try:
            doc = json.loads((self._state.layout.published_index / name).read_bytes())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None
