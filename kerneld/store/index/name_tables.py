"""The naming tables: which tree (``variants``, with the upstream's ids per file in
``variant_files``) each (repo, commit, variant) publishes, where ``refs`` point, and what
variants the upstream lists (``upstream_variants``)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence

from kerneld.store.types import LiveVariantRow, ProvenanceRecord, RefRow, VariantRow, decode_archs

from .database import Database


class NameTables(Database):
    def get_variant(self, repo: str, commit: str, variant: str) -> VariantRow | None:
        row = self._one(
            "SELECT * FROM variants WHERE repo = ? AND commit_sha = ? AND variant = ?",
            (repo, commit, variant),
        )
        if row is None:
            return None
        return VariantRow(row["repo"], row["commit_sha"], row["variant"], row["tree"], row[4])

    def variants_of(self, repo: str, commit: str | None = None) -> list[VariantRow]:
        if commit is None:
            rows = self._all("SELECT * FROM variants WHERE repo = ? ORDER BY 2, 3", (repo,))
        else:
            rows = self._all(
                "SELECT * FROM variants WHERE repo = ? AND commit_sha = ? ORDER BY 3",
                (repo, commit),
            )
        return [VariantRow(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def live_variants_of(self, repo: str) -> list[LiveVariantRow]:
        """One query for a repo's published index (no manifests: a store may hold 100,000 trees)."""
        rows = self._all(
            "SELECT v.commit_sha, v.variant, v.tree, t.metadata_id, t.backend, t.archs, "
            "p.status, p.signer, p.issuer, p.detail, p.checked_at "
            "FROM variants v JOIN trees t ON t.digest = v.tree "
            "LEFT JOIN provenance p ON p.tree = v.tree "
            "WHERE v.repo = ? AND t.state = 'live' ORDER BY 1, 2",
            (repo,),
        )
        return [
            LiveVariantRow(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                decode_archs(r[5]),
                None if r[6] is None else ProvenanceRecord(r[6], r[7], r[8], r[9], r[10]),
            )
            for r in rows
        ]

    def variants_of_tree(self, tree: str) -> list[VariantRow]:
        rows = self._all("SELECT * FROM variants WHERE tree = ?", (tree,))
        return [VariantRow(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def repos(self) -> list[str]:
        rows = self._all(
            "SELECT repo FROM variants UNION SELECT repo FROM refs UNION SELECT repo FROM denies "
            "ORDER BY 1"
        )
        return [r[0] for r in rows]

    def spellings(self, repo: str) -> list[str]:
        """Every repo the index knows that is `repo` in another case (and `repo`): a policy
        change of one is published in each one's document."""
        rows = self._all(
            "SELECT repo FROM variants WHERE repo = ? COLLATE NOCASE UNION "
            "SELECT repo FROM refs WHERE repo = ? COLLATE NOCASE UNION "
            "SELECT repo FROM denies WHERE repo = ? COLLATE NOCASE ORDER BY 1",
            (repo, repo, repo),
        )
        return sorted({repo, *(r[0] for r in rows)})

    @staticmethod
    def put_variant(
        conn: sqlite3.Connection,
        *,
        repo: str,
        commit: str,
        variant: str,
        tree: str,
        upstream_ids: Iterable[tuple[str, str]],
    ) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO variants (repo, commit_sha, variant, tree, published_at) "
            "VALUES (?,?,?,?,?)",
            (repo, commit, variant, tree, time.time()),
        )
        conn.execute(
            "DELETE FROM variant_files WHERE repo = ? AND commit_sha = ? AND variant = ?",
            (repo, commit, variant),
        )
        conn.executemany(
            "INSERT INTO variant_files (repo, commit_sha, variant, path, upstream_id) "
            "VALUES (?,?,?,?,?)",
            [(repo, commit, variant, p, oid) for p, oid in upstream_ids],
        )

    def upstream_ids(self, repo: str, commit: str, variant: str) -> dict[str, str]:
        rows = self._all(
            "SELECT path, upstream_id FROM variant_files WHERE repo = ? AND commit_sha = ? "
            "AND variant = ?",
            (repo, commit, variant),
        )
        return {r[0]: r[1] for r in rows}

    @staticmethod
    def delete_variants_of_tree(conn: sqlite3.Connection, tree: str) -> list[VariantRow]:
        rows = conn.execute("SELECT * FROM variants WHERE tree = ?", (tree,)).fetchall()
        conn.execute("DELETE FROM variants WHERE tree = ?", (tree,))
        for r in rows:
            conn.execute(
                "DELETE FROM variant_files WHERE repo = ? AND commit_sha = ? AND variant = ?",
                (r[0], r[1], r[2]),
            )
        return [VariantRow(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def get_upstream_variants(self, repo: str, commit: str) -> list[str] | None:
        row = self._one(
            "SELECT names FROM upstream_variants WHERE repo = ? AND commit_sha = ?", (repo, commit)
        )
        return None if row is None else list(json.loads(row[0]))

    def all_upstream_variants(self, repo: str) -> dict[str, list[str]]:
        rows = self._all("SELECT commit_sha, names FROM upstream_variants WHERE repo = ?", (repo,))
        return {r[0]: list(json.loads(r[1])) for r in rows}

    @staticmethod
    def put_upstream_variants(
        conn: sqlite3.Connection, repo: str, commit: str, names: Sequence[str]
    ) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO upstream_variants (repo, commit_sha, names, recorded_at) "
            "VALUES (?,?,?,?)",
            (repo, commit, json.dumps(sorted(names)), time.time()),
        )

    # refs

    def get_ref(self, repo: str, ref: str) -> RefRow | None:
        row = self._one("SELECT * FROM refs WHERE repo = ? AND ref = ?", (repo, ref))
        return None if row is None else RefRow(row[0], row[1], row[2], row[3])

    def all_refs(self) -> list[RefRow]:
        rows = self._all("SELECT * FROM refs ORDER BY repo, ref")
        return [RefRow(r[0], r[1], r[2], r[3]) for r in rows]

    def all_variants(self) -> list[VariantRow]:
        rows = self._all("SELECT * FROM variants ORDER BY 1, 2, 3")
        return [VariantRow(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def refs_of(self, repo: str) -> list[RefRow]:
        rows = self._all("SELECT * FROM refs WHERE repo = ? ORDER BY ref", (repo,))
        return [RefRow(r[0], r[1], r[2], r[3]) for r in rows]

    @staticmethod
    def put_ref(
        conn: sqlite3.Connection, repo: str, ref: str, commit: str, fetched_at: float
    ) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO refs (repo, ref, commit_sha, fetched_at) VALUES (?,?,?,?)",
            (repo, ref, commit, fetched_at),
        )
