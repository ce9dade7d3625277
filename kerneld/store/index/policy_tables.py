"""The policy tables: ``pins`` (GC roots), ``denies`` (refused kernels) and ``negative`` (the
cache of failed upstream lookups, bounded: callers choose what is looked up)."""

from __future__ import annotations

import sqlite3
import time

from kerneld.store.types import DenyRow, NegativeRow, PinRow

from .database import Database

#: Rows the negative cache keeps at most (each is a failed upstream lookup a caller caused).
MAX_NEGATIVE = 10_000


class PolicyTables(Database):
    """Pins and denies name a repo as an admin typed it and match every spelling of it
    (`COLLATE NOCASE`: the Hub resolves repo ids case-insensitively; ids are ASCII); one row
    per repo, whatever its case, and revision (a new spelling replaces the old one)."""

    def pins(self) -> list[PinRow]:
        return [PinRow(r[0], r[1], r[2], r[3]) for r in self._all("SELECT * FROM pins ORDER BY 1")]

    @staticmethod
    def put_pin(conn: sqlite3.Connection, repo: str, revision: str, variant: str) -> None:
        conn.execute(
            "DELETE FROM pins WHERE repo = ? COLLATE NOCASE AND revision = ? AND variant = ?",
            (repo, revision, variant),
        )
        conn.execute("INSERT INTO pins VALUES (?,?,?,?)", (repo, revision, variant, time.time()))

    @staticmethod
    def delete_pin(conn: sqlite3.Connection, repo: str, revision: str, variant: str) -> bool:
        cur = conn.execute(
            "DELETE FROM pins WHERE repo = ? COLLATE NOCASE AND revision = ? AND variant = ?",
            (repo, revision, variant),
        )
        return cur.rowcount > 0

    def denies(self, repo: str | None = None) -> list[DenyRow]:
        """Every deny, or those of `repo` in any spelling."""
        if repo is None:
            rows = self._all("SELECT * FROM denies ORDER BY repo, revision")
        else:
            rows = self._all(
                "SELECT * FROM denies WHERE repo = ? COLLATE NOCASE ORDER BY revision, repo",
                (repo,),
            )
        return [DenyRow(r[0], r[1], r[2], r[3]) for r in rows]

    @staticmethod
    def put_deny(conn: sqlite3.Connection, repo: str, revision: str, reason: str) -> None:
        conn.execute(
            "DELETE FROM denies WHERE repo = ? COLLATE NOCASE AND revision = ?", (repo, revision)
        )
        conn.execute("INSERT INTO denies VALUES (?,?,?,?)", (repo, revision, reason, time.time()))

    @staticmethod
    def delete_deny(conn: sqlite3.Connection, repo: str, revision: str) -> bool:
        cur = conn.execute(
            "DELETE FROM denies WHERE repo = ? COLLATE NOCASE AND revision = ?", (repo, revision)
        )
        return cur.rowcount > 0

    @staticmethod
    def put_negative(
        conn: sqlite3.Connection,
        row: NegativeRow,
        *,
        limit: int = MAX_NEGATIVE,
    ) -> None:
        """Remember a failed lookup; expired rows are purged on the way and at most `limit`
        rows kept (the oldest go): callers choose what is looked up, so the table must not
        grow with what they ask."""
        conn.execute("DELETE FROM negative WHERE expires_at <= ?", (row.created_at,))
        conn.execute(
            "INSERT OR REPLACE INTO negative VALUES (?,?,?,?,?,?)",
            (row.repo, row.revision, row.variant, row.reason, row.created_at, row.expires_at),
        )
        count = int(conn.execute("SELECT COUNT(*) FROM negative").fetchone()[0])
        if count > limit:
            conn.execute(
                "DELETE FROM negative WHERE rowid IN (SELECT rowid FROM negative "
                "ORDER BY expires_at LIMIT ?)",
                (count - limit,),
            )

    @staticmethod
    def delete_negative_of(conn: sqlite3.Connection, repo: str) -> None:
        """Forget `repo`'s failed lookups (something of it was just published)."""
        conn.execute("DELETE FROM negative WHERE repo = ?", (repo,))

    def negative_count(self) -> int:
        row = self._one("SELECT COUNT(*) FROM negative")
        return int(row[0]) if row else 0

    def get_negative(self, repo: str, revision: str, variant: str) -> NegativeRow | None:
        r = self._one(
            "SELECT * FROM negative WHERE repo = ? AND revision = ? AND variant = ?",
            (repo, revision, variant),
        )
        return None if r is None else NegativeRow(r[0], r[1], r[2], r[3], r[4], r[5])
