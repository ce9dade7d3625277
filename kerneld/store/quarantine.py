"""The quarantine (``v1/quarantine/``): where repair and the scrub move what they take out of
service instead of deleting it, since a damaged tree or blob may be the only copy (an
air-gapped host, an upstream that no longer has it). Each entry keeps a note of what it was
(entry.json); entries served again are dropped, the rest stay until an admin restores or drops
them or `max_bytes` makes room for a newer one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .errors import InvalidInputError
from .ingest import Ingest
from .layout import DIR_MODE_PRIVATE, fsync_dir
from .manifest import TreeFile, parse_manifest
from .publishing import Publisher, TreeInfo
from .state import StoreState
from .trees import remove_tree, unseal_top
from .verify import DEFAULT_QUARANTINE_MAX_BYTES, Quarantined, entry_bytes

log = logging.getLogger("kerneld.store")


class Quarantine:
    """Adds, lists, bounds, restores and drops quarantine entries."""

    def __init__(self, state: StoreState, ingest: Ingest, publisher: Publisher) -> None:
        self._state = state
        self._ingest = ingest
        self._publisher = publisher
        self.max_bytes = DEFAULT_QUARANTINE_MAX_BYTES
        """The quarantine's bound (``[store] quarantine_max``; the daemon sets it from its
        config, 0: none). Checked whenever an entry is added (`bound`)."""

    def add(self, path: Path, obj: str, ident: str, note: dict[str, Any]) -> Quarantined | None:
        """Move ``path`` into a new quarantine entry with ``note`` beside it (entry.json).

        None when there is nothing on disk. A path this process may not move (a directory owned
        by another user cannot be renamed to another parent) stays where it is, out of service,
        and the entry says so.
        """
        base = self._state.layout.quarantine
        if not os.path.lexists(path):
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{stamp}-{obj}-{ident[:16]}-{os.urandom(3).hex()}"
        qdir = base / name
        base.mkdir(mode=DIR_MODE_PRIVATE, exist_ok=True)
        qdir.mkdir(mode=DIR_MODE_PRIVATE)
        moved_to = qdir / obj
        moved = True
        try:
            if not path.is_symlink() and path.is_dir():
                unseal_top(path)  # renaming a directory to another parent rewrites its ".."
            os.rename(path, moved_to)
            fsync_dir(path.parent)
        except OSError as exc:
            moved = False
            note["not_moved"] = f"{exc.strerror}: left at {path}; remove it as root"
            log.error("quarantine: could not move %s: %s; it stays, out of service", path, exc)
        doc = {
            "object": obj,
            "id": ident,
            "original_path": str(path),
            "quarantined_at": time.time(),
            "moved": moved,
            # Recorded once, so that listings and the bound need not walk the entries.
            "bytes": entry_bytes(moved_to) if moved else 0,
            **note,
        }
        tmp = qdir / "entry.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, qdir / "entry.json")
        fsync_dir(qdir)
        fsync_dir(base)
        entry = Quarantined.from_doc(qdir, doc)
        log.warning("quarantine: %s", entry.describe())
        self.bound(keep=entry.name)
        return entry

    def entries(self) -> list[Quarantined]:
        """Every quarantine entry, oldest first."""
        out = []
        base = self._state.layout.quarantine
        for qdir in sorted(base.iterdir()) if base.is_dir() else []:
            try:
                doc = json.loads((qdir / "entry.json").read_text())
            except (OSError, ValueError):
                continue  # half-written (a crash between mkdir and entry.json): nothing moved
            out.append(Quarantined.from_doc(qdir, doc))
        return out

    def _replaced(self, q: Quarantined) -> bool:
        """True when the store serves again whatever the entry held (re-fetched from upstream)."""
        index = self._state.index
        if q.object == "blob":
            brow = index.get_blob(q.id)
            return brow is not None and brow.state == "live"
        if q.object != "tree" or not q.variants:
            return False
        for repo, commit, variant in q.variants:
            vrow = index.get_variant(repo, commit, variant)
            tree = index.get_tree(vrow.tree) if vrow is not None else None
            if tree is None or tree.state != "live":
                return False
        return True

    def prune(self) -> list[Quarantined]:
        """Drop entries that are served again (replaced by a re-fetch); the dropped ones."""
        self._state.writable()
        dropped = []
        for q in self.entries():
            if q.moved and self._replaced(q):
                remove_tree(q.path)
                dropped.append(q)
                log.info("quarantine: dropped %s: it is served again", q.name)
        return dropped

    def drop(self, name: str) -> Quarantined:
        """Delete one quarantine entry for good (an admin decided it is not needed)."""
        self._state.writable()
        q = self.entry(name)
        remove_tree(q.path)
        log.warning("quarantine: %s dropped by an admin", q.name)
        return q

    def entry(self, name: str) -> Quarantined:
        """The entry with this name (or path); InvalidInputError: there is none."""
        for q in self.entries():
            if q.name == name or q.path == Path(name):
                return q
        raise InvalidInputError(
            f"no quarantine entry {name!r} in {self._state.layout.quarantine}; `kerneldctl "
            "verify` lists them",
            path=str(self._state.layout.quarantine),
        )

    def restore(self, name: str) -> list[TreeInfo]:
        """Put a quarantined tree (or blob) back into service, checked like a mirror import:
        every file is re-hashed against its manifest while it is copied into fresh blobs, so
        only intact bytes come back. Fix what made it untrusted (owner, mode) first if it was
        not moved. The entry is removed once everything is published again."""
        self._state.writable()
        q = self.entry(name)
        if not q.moved:
            raise InvalidInputError(
                f"{q.name} was left at {q.original}; nothing to restore from the quarantine",
                path=str(q.path),
            )
        doc = json.loads((q.path / "entry.json").read_text())
        published: list[TreeInfo] = []
        ingest_file = self._ingest.ingest_file
        if q.object == "blob":
            ingest_file(q.path / "blob", sha256=q.id, size=int(doc.get("size") or 0) or None)
        elif q.object == "tree":
            files = []
            for e in parse_manifest(doc["manifest"].encode()):
                ingest_file(q.path / "tree" / e.path, sha256=e.sha256, size=e.size)
                files.append((e, 0o100755 if e.mode & 0o111 else 0o100644))
            for v in doc.get("variants", []):
                ids: dict[str, str] = v.get("ids") or {}
                published.append(
                    self._publisher.publish_tree(
                        v["repo"],
                        v["commit"],
                        v["variant"],
                        [
                            TreeFile(e.path, e.sha256, e.size, mode, ids.get(e.path))
                            for e, mode in files
                        ],
                    )
                )
        else:
            raise InvalidInputError(
                f"{q.name} is a file the index never knew ({q.original}); it is not store "
                f"content and cannot be restored: inspect it, then drop it",
                path=str(q.path),
            )
        remove_tree(q.path)
        log.warning("quarantine: %s restored (%d variant(s))", q.name, len(published))
        return published

    def count(self) -> int:
        """Entries in the quarantine, without reading them (the status line, every few s)."""
        try:
            return len(os.listdir(self._state.layout.quarantine))
        except OSError:
            return 0

    def usage(self) -> tuple[int, int]:
        """(entries, bytes they hold) of the quarantine: what status and metrics show."""
        entries = self.entries()
        return len(entries), sum(q.size_bytes for q in entries)

    def bound(self, keep: str) -> list[Quarantined]:
        """Drop entries until the quarantine is within `max_bytes`, never ``keep`` (the entry
        just added: the newest damage is the one an admin still has to look at).

        Entries served again go first (nothing is lost with them), then the oldest; entries
        that hold no bytes (left in place) are kept, dropping them frees nothing. One log line
        per entry dropped, saying what it was and why it went.
        """
        bound = self.max_bytes
        if bound <= 0:
            return []
        entries = self.entries()
        total = sum(q.size_bytes for q in entries)
        if total <= bound:
            return []
        others = [q for q in entries if q.name != keep and q.size_bytes > 0]
        replaced = {q.name for q in others if q.moved and self._replaced(q)}
        order = sorted(others, key=lambda q: (q.name not in replaced, q.quarantined_at, q.name))
        dropped = []
        for q in order:
            if total <= bound:
                break
            remove_tree(q.path)
            total -= q.size_bytes
            dropped.append(q)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(q.quarantined_at))
            log.warning(
                "quarantine: dropped %s (%s, %d bytes, quarantined %s UTC by %s%s): the "
                "quarantine was over [store] quarantine_max = %d bytes with the new entry %s; "
                "%s",
                q.name,
                q.what,
                q.size_bytes,
                when,
                q.by or "?",
                f", {q.reason}" if q.reason else "",
                bound,
                keep,
                "it is served again" if q.name in replaced else "the oldest entries go first",
            )
        if total > bound:
            log.warning(
                "quarantine: %d bytes after dropping %d older entr(ies), over [store] "
                "quarantine_max = %d bytes: the new entry %s alone is larger; it is kept",
                total,
                len(dropped),
                bound,
                keep,
            )
        return dropped

    def annotate(self, name: str, extra: dict[str, Any]) -> Quarantined:
        """Add ``extra`` to an entry's entry.json (who reported the damage, and why): the
        forensics an admin reads before restoring or dropping it."""
        self._state.writable()
        q = self.entry(name)
        path = q.path / "entry.json"
        doc = {**json.loads(path.read_text()), **extra}
        tmp = q.path / "entry.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        fsync_dir(q.path)
        return Quarantined.from_doc(q.path, doc)
