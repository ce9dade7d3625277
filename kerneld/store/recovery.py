"""Crash recovery, at every read-write open: finish or undo whatever an interrupted process
left, so a crash at any instant leaves no half-valid object (validity is an index row, see
``index``): staging builds and stale partial downloads go, ``pending`` rows and their files go,
``dead`` rows are purged (unless a client still holds the tree), then the published index is
checked against the index.
"""

from __future__ import annotations

import logging
import time

from . import published_index
from .collector import Collector
from .locks import is_held
from .published_index_writer import PublishedIndexWriter
from .state import StoreState
from .trees import remove_tree

log = logging.getLogger("kerneld.store")


def recover(
    state: StoreState,
    collector: Collector,
    writer: PublishedIndexWriter,
    *,
    partial_grace_s: float,
) -> None:
    """Finish or undo whatever an interrupted process left (runs at every read-write open)."""
    lay, index = state.layout, state.index
    for child in list(lay.staging.iterdir()):
        remove_tree(child)
    collector.empty_trash()
    now = time.time()
    for part in list(lay.ingest.iterdir()):
        try:
            if part.stat().st_mtime < now - partial_grace_s:
                part.unlink()
                log.info("removed stale partial download %s", part.name)
        except FileNotFoundError:
            pass
    published_index.clean_temporaries(lay)
    with state.lock:
        for blob in index.blobs("pending"):
            lay.blob_path(blob.sha256).unlink(missing_ok=True)
            with index.tx() as conn:
                index.delete_blob(conn, blob.sha256)
            log.info("recovery: dropped unfinished blob %s", blob.sha256)
        for tree in index.trees("pending"):
            collector.move_to_trash(lay.tree_path(tree.digest))
            with index.tx() as conn:
                index.delete_tree(conn, tree.digest)
            log.info("recovery: dropped unfinished tree %s", tree.digest)
        for tree in index.trees("dead"):
            if is_held(lay.lock_path(tree.digest)):
                # A client found it through a stale published index: keep it alive for now
                # (unreferenced, so the next GC collects it once the client is gone).
                with index.tx() as conn:
                    index.set_tree_state(conn, tree.digest, "live")
                    for _path, sha in index.tree_blobs(tree.digest):
                        index.set_blob_state(conn, sha, "live")
                log.info("recovery: tree %s is in use, kept", tree.digest)
    collector.purge_dead({})
    with state.lock:
        live = set(index.tree_digests("live"))
        for lock_file in list(lay.locks.iterdir()):
            name = lock_file.name.removesuffix(".lock")
            if name not in live and not is_held(lock_file):
                lock_file.unlink(missing_ok=True)
        writer.rebuild()
    collector.empty_trash()
