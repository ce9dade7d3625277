"""The ``leases`` table: time-bounded GC roots that callers take on trees, bounded per holder
and in all (`trim_leases`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from kerneld.store.types import LeaseRow

from .database import Database


class LeaseTable(Database):
    def leases(self) -> list[LeaseRow]:
        return [LeaseRow(r[0], r[1], r[2], r[3], r[4]) for r in self._all("SELECT * FROM leases")]

    def get_lease(self, lease_id: str) -> LeaseRow | None:
        r = self._one("SELECT * FROM leases WHERE id = ?", (lease_id,))
        return None if r is None else LeaseRow(r[0], r[1], r[2], r[3], r[4])

    @staticmethod
    def put_lease(conn: sqlite3.Connection, lease: LeaseRow) -> None:
        conn.execute(
            "INSERT INTO leases VALUES (?,?,?,?,?)",
            (lease.id, lease.tree, lease.holder, lease.created_at, lease.expires_at),
        )

    @staticmethod
    def put_leases_on_live_trees(
        conn: sqlite3.Connection, rows: Sequence[tuple[str, str, float, float, str]]
    ) -> int:
        """Insert ``(id, holder, created_at, expires_at, tree)`` rows in one statement each
        (``executemany``: a large batch costs little Python time), skipping trees that are not
        live; returns how many were recorded."""
        before = conn.total_changes
        conn.executemany(
            "INSERT OR REPLACE INTO leases (id, tree, holder, created_at, expires_at) "
            "SELECT ?1, digest, ?2, ?3, ?4 FROM trees WHERE digest = ?5 AND state = 'live'",
            rows,
        )
        return conn.total_changes - before

    @staticmethod
    def extend_lease(conn: sqlite3.Connection, lease_id: str, expires_at: float) -> None:
        conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (expires_at, lease_id))

    @staticmethod
    def delete_lease(conn: sqlite3.Connection, lease_id: str) -> bool:
        return conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,)).rowcount > 0

    @staticmethod
    def delete_expired_leases(conn: sqlite3.Connection, now: float) -> int:
        return int(conn.execute("DELETE FROM leases WHERE expires_at <= ?", (now,)).rowcount)

    @staticmethod
    def trim_leases(
        conn: sqlite3.Connection,
        holders: Iterable[str],
        now: float,
        *,
        per_holder: int,
        total: int,
    ) -> int:
        """Bound the lease table: each of `holders` keeps its `per_holder` latest-expiring
        leases, the table its `total` latest (expired rows go first); 0 means no bound. The
        `holder` is self-reported, so both bounds are needed: one caller under many names still
        meets the total. Returns the rows dropped (their trees lose that protection early)."""
        dropped = 0
        if per_holder > 0:
            for holder in set(holders):
                dropped += conn.execute(
                    "DELETE FROM leases WHERE id IN (SELECT id FROM leases WHERE holder = ? "
                    "ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
                    (holder, per_holder),
                ).rowcount
        if total > 0:
            count = int(conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0])
            if count > total:
                dropped += conn.execute("DELETE FROM leases WHERE expires_at <= ?", (now,)).rowcount
                dropped += conn.execute(
                    "DELETE FROM leases WHERE id IN (SELECT id FROM leases "
                    "ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
                    (total,),
                ).rowcount
        return dropped
