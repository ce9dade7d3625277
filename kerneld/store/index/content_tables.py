"""The content tables: ``blobs``, ``trees`` with their ``tree_files``, and each tree's
``provenance``. A blob or tree is valid only while its row is ``live`` (see the package)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence

from kerneld.store.types import BlobRow, ProvenanceRecord, TreeRow, decode_archs

from .database import Database

_TREE_COLUMNS_NO_MANIFEST = (
    "digest, size, files, copied_bytes, metadata_id, backend, archs, state, created_at, "
    "last_resolved"
)


def _tree(row: sqlite3.Row) -> TreeRow:
    return TreeRow(
        digest=row["digest"],
        size=row["size"],
        files=row["files"],
        copied_bytes=row["copied_bytes"],
        manifest=bytes(row["manifest"]),
        metadata_id=row["metadata_id"],
        backend=row["backend"],
        archs=decode_archs(row["archs"]),
        state=row["state"],
        created_at=row["created_at"],
        last_resolved=row["last_resolved"],
    )


def _blob(row: sqlite3.Row) -> BlobRow:
    return BlobRow(row["sha256"], row["size"], row["git_sha1"], row["state"], row["created_at"])


class ContentTables(Database):
    def get_blob(self, sha256: str) -> BlobRow | None:
        row = self._one("SELECT * FROM blobs WHERE sha256 = ?", (sha256,))
        return None if row is None else _blob(row)

    def find_blob_by_git_sha1(self, git_sha1: str) -> BlobRow | None:
        row = self._one(
            "SELECT * FROM blobs WHERE git_sha1 = ? AND state = 'live' LIMIT 1", (git_sha1,)
        )
        return None if row is None else _blob(row)

    def blobs(self, state: str | None = None) -> list[BlobRow]:
        if state is None:
            return [_blob(r) for r in self._all("SELECT * FROM blobs ORDER BY sha256")]
        rows = self._all("SELECT * FROM blobs WHERE state = ? ORDER BY sha256", (state,))
        return [_blob(r) for r in rows]

    @staticmethod
    def put_blob(
        conn: sqlite3.Connection, sha256: str, size: int, git_sha1: str | None, state: str
    ) -> None:
        conn.execute(
            "INSERT INTO blobs (sha256, size, git_sha1, state, created_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT (sha256) DO UPDATE SET state = excluded.state, "
            "created_at = excluded.created_at, "
            "git_sha1 = COALESCE(excluded.git_sha1, blobs.git_sha1)",
            (sha256, size, git_sha1, state, time.time()),
        )

    def claim_blob(self, sha256: str, now: float) -> None:
        """Restart a live blob's orphan grace period: a publish that will use it is coming."""
        with self._lock:
            self.conn.execute(
                "UPDATE blobs SET created_at = ? WHERE sha256 = ? AND state = 'live'",
                (now, sha256),
            )

    @staticmethod
    def set_blob_state(conn: sqlite3.Connection, sha256: str, state: str) -> None:
        conn.execute("UPDATE blobs SET state = ? WHERE sha256 = ?", (state, sha256))

    @staticmethod
    def delete_blob(conn: sqlite3.Connection, sha256: str) -> None:
        conn.execute("DELETE FROM blobs WHERE sha256 = ?", (sha256,))

    def count(self, table: str, state: str) -> int:
        """Rows of `blobs` or `trees` in `state`, counted by SQLite: `usage()` and every
        GetStatus read this, and loading 100,000 rows (manifests included) to count them took
        0.86 s."""
        if table not in ("blobs", "trees"):
            raise ValueError(f"no state to count in table {table!r}")
        row = self._one(f"SELECT COUNT(*) AS n FROM {table} WHERE state = ?", (state,))  # noqa: S608
        return int(row["n"]) if row else 0

    def usage(self) -> int:
        """Bytes the store occupies: every blob with a row, plus copied (non-linked) tree files."""
        row = self._one(
            "SELECT (SELECT COALESCE(SUM(size), 0) FROM blobs) "
            "+ (SELECT COALESCE(SUM(copied_bytes), 0) FROM trees) AS total"
        )
        return int(row["total"]) if row else 0

    # trees

    def get_tree(self, digest: str) -> TreeRow | None:
        row = self._one("SELECT * FROM trees WHERE digest = ?", (digest,))
        return None if row is None else _tree(row)

    def trees(self, state: str | None = None, *, manifests: bool = True) -> list[TreeRow]:
        """Tree rows; ``manifests=False`` leaves `manifest` empty (GC of a big store needs
        every row but none of the manifests)."""
        columns = "*" if manifests else f"{_TREE_COLUMNS_NO_MANIFEST}, x'' AS manifest"
        if state is None:
            return [_tree(r) for r in self._all(f"SELECT {columns} FROM trees ORDER BY digest")]  # noqa: S608
        rows = self._all(
            f"SELECT {columns} FROM trees WHERE state = ? ORDER BY digest",  # noqa: S608
            (state,),
        )
        return [_tree(r) for r in rows]

    def tree_digests(self, state: str, *, limit: int = -1) -> list[str]:
        """Digests only (no manifests): cheap to hold for a whole store; `limit` for batches."""
        rows = self._all(
            "SELECT digest FROM trees WHERE state = ? ORDER BY digest LIMIT ?", (state, limit)
        )
        return [str(r[0]) for r in rows]

    def blob_digests(self, state: str, *, limit: int = -1) -> list[str]:
        """sha256 of the blobs in `state` (no other columns), at most `limit` of them."""
        rows = self._all(
            "SELECT sha256 FROM blobs WHERE state = ? ORDER BY sha256 LIMIT ?", (state, limit)
        )
        return [str(r[0]) for r in rows]

    def trees_of_blob(self, sha256: str) -> list[str]:
        rows = self._all(
            "SELECT DISTINCT tree FROM tree_files WHERE blob = ? ORDER BY tree", (sha256,)
        )
        return [str(r[0]) for r in rows]

    def all_tree_files(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._all("SELECT tree, blob FROM tree_files")]

    def tree_blobs(self, digest: str) -> list[tuple[str, str]]:
        rows = self._all("SELECT path, blob FROM tree_files WHERE tree = ?", (digest,))
        return [(r["path"], r["blob"]) for r in rows]

    @staticmethod
    def put_tree(
        conn: sqlite3.Connection,
        *,
        digest: str,
        size: int,
        files: Iterable[tuple[str, str]],
        copied_bytes: int,
        manifest: bytes,
        metadata_id: str | None,
        backend: str | None,
        archs: Sequence[str],
        state: str,
    ) -> None:
        now = time.time()
        conn.execute("DELETE FROM tree_files WHERE tree = ?", (digest,))
        file_rows = [(digest, path, blob) for path, blob in files]
        conn.execute(
            "INSERT OR REPLACE INTO trees (digest, size, files, copied_bytes, manifest, "
            "metadata_id, backend, archs, state, created_at, last_resolved) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                digest,
                size,
                len(file_rows),
                copied_bytes,
                manifest,
                metadata_id,
                backend,
                json.dumps(list(archs)),
                state,
                now,
                now,
            ),
        )
        conn.executemany("INSERT INTO tree_files (tree, path, blob) VALUES (?,?,?)", file_rows)

    @staticmethod
    def set_tree_state(conn: sqlite3.Connection, digest: str, state: str) -> None:
        conn.execute("UPDATE trees SET state = ? WHERE digest = ?", (state, digest))

    @staticmethod
    def delete_tree(conn: sqlite3.Connection, digest: str) -> None:
        conn.execute("DELETE FROM tree_files WHERE tree = ?", (digest,))
        conn.execute("DELETE FROM trees WHERE digest = ?", (digest,))
        conn.execute("DELETE FROM leases WHERE tree = ?", (digest,))
        conn.execute("DELETE FROM provenance WHERE tree = ?", (digest,))

    def get_provenance(self, digest: str) -> ProvenanceRecord | None:
        """The ingest check's answer for a tree; None: never checked (or a store opened
        read-only that no provenance-aware kerneld has opened yet)."""
        try:
            row = self._one("SELECT * FROM provenance WHERE tree = ?", (digest,))
        except sqlite3.OperationalError:  # no such table: read-only open of an older store
            return None
        if row is None:
            return None
        return ProvenanceRecord(
            row["status"], row["signer"], row["issuer"], row["detail"], row["checked_at"]
        )

    @staticmethod
    def put_provenance(conn: sqlite3.Connection, digest: str, record: ProvenanceRecord) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO provenance (tree, status, signer, issuer, detail, checked_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (digest, record.status, record.signer, record.issuer, record.detail, record.checked_at),
        )

    def touch_tree(self, digest: str, now: float, resolution: float = 1.0) -> None:
        """Record a resolve (throttled: at most one write per ``resolution`` seconds)."""
        with self._lock:
            self.conn.execute(
                "UPDATE trees SET last_resolved = ? WHERE digest = ? AND last_resolved < ?",
                (now, digest, now - resolution),
            )

    @staticmethod
    def touch_trees(conn: sqlite3.Connection, touches: Sequence[tuple[str, float]]) -> None:
        """Record resolve times ``(tree, unix time)`` (LRU), never moving one backwards."""
        conn.executemany(
            "UPDATE trees SET last_resolved = ? WHERE digest = ? AND last_resolved < ?",
            [(at, tree, at) for tree, at in touches],
        )
