"""The ``meta`` table: small store-level facts (the published index generation, the owner's uid,
when the scrub last ran, the versions an upstream last listed)."""

from __future__ import annotations

import json
import sqlite3

from .database import Database


class MetaTable(Database):
    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if row is None else str(row["value"])

    def set_meta(self, conn: sqlite3.Connection, key: str, value: str) -> None:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    @staticmethod
    def delete_meta(conn: sqlite3.Connection, key: str) -> None:
        conn.execute("DELETE FROM meta WHERE key = ?", (key,))

    def next_generation(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        gen = (int(row["value"]) if row else 0) + 1
        self.set_meta(conn, "generation", str(gen))
        return gen

    def put_upstream_versions(
        self, conn: sqlite3.Connection, repo: str, versions: list[int]
    ) -> None:
        """Every `vN` the upstream listed for `repo` (kept as a meta row: one small list)."""
        self.set_meta(conn, f"upstream-versions/{repo}", json.dumps(sorted(set(versions))))

    def upstream_versions(self, repo: str) -> list[int] | None:
        raw = self.get_meta(f"upstream-versions/{repo}")
        return None if raw is None else [int(v) for v in json.loads(raw)]
