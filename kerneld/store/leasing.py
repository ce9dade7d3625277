"""Leases: time-bounded GC roots on trees (containerd keeps its leases apart from its content
store too). A lookup may take one; the daemon grants leases at once and records them behind in
batches (`LeaseManager.record`), bounded per holder and in all.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import LeaseNotFoundError, TreeNotFoundError
from .paths import tree_hex
from .state import StoreState
from .types import LeaseRow


@dataclass(frozen=True)
class Lease:
    id: str
    tree: str
    """Tree digest, ``sha256:<hex>``."""
    expires_at: float
    holder: str = ""


class LeaseManager:
    """Takes, records, renews and releases leases (the ``leases`` table)."""

    def __init__(self, state: StoreState) -> None:
        self._state = state

    def acquire(self, tree: str, ttl_s: float, *, holder: str = "") -> Lease:
        """Keep a live tree from GC for ``ttl_s`` seconds."""
        state, index = self._state, self._state.index
        state.writable()
        hexd = tree_hex(tree)
        with state.lock:
            row = index.get_tree(hexd)
            if row is None or row.state != "live":
                raise TreeNotFoundError(f"no live tree sha256:{hexd} to lease")
            now = time.time()
            lease = Lease(uuid.uuid4().hex, f"sha256:{hexd}", now + ttl_s, holder)
            with index.tx() as conn:
                index.put_lease(conn, LeaseRow(lease.id, hexd, holder, now, lease.expires_at))
        return lease

    def record(
        self,
        leases: Sequence[Lease],
        *,
        resolved: Iterable[tuple[str, float]] = (),
        per_holder: int = 0,
        total: int = 0,
    ) -> int:
        """Record leases granted ahead of the write, in one transaction (one fsync for a
        batch: the daemon answers Resolve at once and writes its leases behind), together with
        the resolve times (LRU) of trees served from its memory, ``(tree digest, unix time)``.
        Leases on trees that are no longer live (or already expired) are skipped; returns how
        many were recorded. The rows go in with ``executemany`` so a large batch costs little
        Python time (request threads wait for the GIL meanwhile). ``per_holder``/``total``
        bound the table in the same transaction (``Index.trim_leases``)."""
        state, index = self._state, self._state.index
        state.writable()
        now = time.time()
        touches = [(tree_hex(tree), at) for tree, at in resolved]
        rows = [
            (lease.id, lease.holder, now, lease.expires_at, tree_hex(lease.tree))
            for lease in leases
            if lease.expires_at > now
        ]
        if not rows and not touches:
            return 0
        with state.lock, index.tx() as conn:
            if touches:
                index.touch_trees(conn, touches)
            recorded = index.put_leases_on_live_trees(conn, rows)
            if rows and (per_holder or total):
                holders = {lease.holder for lease in leases}
                index.trim_leases(conn, holders, now, per_holder=per_holder, total=total)
            return recorded

    def renew(self, lease_id: str, ttl_s: float) -> Lease:
        """Extend an unexpired lease to ``ttl_s`` from now (LeaseNotFoundError: gone)."""
        state, index = self._state, self._state.index
        state.writable()
        with state.lock:
            row = index.get_lease(lease_id)
            now = time.time()
            if row is None or row.expires_at <= now:
                raise LeaseNotFoundError(f"lease {lease_id} is unknown or expired; resolve again")
            with index.tx() as conn:
                index.extend_lease(conn, lease_id, now + ttl_s)
            return Lease(row.id, f"sha256:{row.tree}", now + ttl_s, row.holder)

    def release(self, lease_id: str) -> bool:
        """Drop a lease; False: there was none."""
        state = self._state
        state.writable()
        with state.lock, state.index.tx() as conn:
            return state.index.delete_lease(conn, lease_id)

    def rows(self) -> list[LeaseRow]:
        """Every recorded lease, expired ones included until GC drops them."""
        return self._state.index.leases()
