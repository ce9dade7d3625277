"""The store's index: one SQLite database (WAL) that decides what is valid.

A blob or tree is valid only while it has a row in state ``live``. ``pending`` rows are written
just before a file is renamed into place and turned ``live`` right after; ``dead`` rows are
written by GC and repair before files are deleted. Opening the store finishes or undoes both
(see ``Store._recover``), so a crash at any instant leaves no half-valid object.

Schema changes are migrations keyed by ``PRAGMA user_version``. A database newer than this code
is refused (no silent downgrade).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import SchemaError

SCHEMA_VERSION = 1

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE blobs (
        sha256 TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        git_sha1 TEXT,
        state TEXT NOT NULL CHECK (state IN ('pending', 'live', 'dead')),
        created_at REAL NOT NULL  -- ingested, or last claimed for a coming publish
    );
    CREATE INDEX blobs_git_sha1 ON blobs (git_sha1);
    CREATE TABLE trees (
        digest TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        files INTEGER NOT NULL,
        copied_bytes INTEGER NOT NULL,
        manifest BLOB NOT NULL,
        metadata_id TEXT,
        backend TEXT,
        archs TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'live', 'dead')),
        created_at REAL NOT NULL,
        last_resolved REAL NOT NULL
    );
    CREATE TABLE tree_files (
        tree TEXT NOT NULL,
        path TEXT NOT NULL,
        blob TEXT NOT NULL,
        PRIMARY KEY (tree, path)
    );
    CREATE INDEX tree_files_blob ON tree_files (blob);
    CREATE TABLE variants (
        repo TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        variant TEXT NOT NULL,
        tree TEXT NOT NULL,
        published_at REAL NOT NULL,
        PRIMARY KEY (repo, commit_sha, variant)
    );
    CREATE INDEX variants_tree ON variants (tree);
    CREATE TABLE variant_files (
        repo TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        variant TEXT NOT NULL,
        path TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        PRIMARY KEY (repo, commit_sha, variant, path)
    );
    CREATE TABLE upstream_variants (
        repo TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        names TEXT NOT NULL,
        recorded_at REAL NOT NULL,
        PRIMARY KEY (repo, commit_sha)
    );
    CREATE TABLE refs (
        repo TEXT NOT NULL,
        ref TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        fetched_at REAL NOT NULL,
        PRIMARY KEY (repo, ref)
    );
    CREATE TABLE pins (
        repo TEXT NOT NULL,
        revision TEXT NOT NULL,
        variant TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (repo, revision, variant)
    );
    CREATE TABLE denies (
        repo TEXT NOT NULL,
        revision TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (repo, revision)
    );
    CREATE TABLE leases (
        id TEXT PRIMARY KEY,
        tree TEXT NOT NULL,
        holder TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE INDEX leases_tree ON leases (tree);
    CREATE TABLE negative (
        repo TEXT NOT NULL,
        revision TEXT NOT NULL,
        variant TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (repo, revision, variant)
    );
    """,
}

#: Additions after schema 1, created when a store is opened read-write (an older kerneld opens
#: such a database unchanged: it just does not use them, so no version bump and no downgrade
#: wall). The indexes keep the bounds on what callers make the daemon store (leases per holder,
#: expired rows) cheap to enforce. ``provenance`` is one row per tree whose sigstore bundle was
#: checked at ingest (kerneld/provenance.py); a tree's digest covers the bundle and the files, so
#: the answer belongs to the tree, whichever repo or revision publishes it.
_ADDITIONS = (
    "CREATE INDEX IF NOT EXISTS leases_holder ON leases (holder, expires_at)",
    "CREATE INDEX IF NOT EXISTS leases_expires ON leases (expires_at)",
    "CREATE INDEX IF NOT EXISTS negative_expires ON negative (expires_at)",
    """CREATE TABLE IF NOT EXISTS provenance (
        tree TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        signer TEXT NOT NULL,
        issuer TEXT NOT NULL,
        detail TEXT NOT NULL,
        checked_at REAL NOT NULL
    )""",
)

#: Rows the negative cache keeps at most (each is a failed upstream lookup a caller caused).
MAX_NEGATIVE = 10_000

ALL = "*"


@dataclass(frozen=True)
class TreeRow:
    digest: str
    size: int
    files: int
    copied_bytes: int
    manifest: bytes
    metadata_id: str | None
    backend: str | None
    archs: list[str]
    state: str
    created_at: float
    last_resolved: float


@dataclass(frozen=True)
class ProvenanceRecord:
    """What the ingest check found out about a tree's signature (kerneld/provenance.py)."""

    status: str
    """"verified" (signed by a trusted identity, and the signed metadata's digest covers the
    files), "unsigned" (no bundle), "invalid" (a bundle that does not verify, or an untrusted
    signer) or "unchecked" (the check could not run: no trust root)."""
    signer: str = ""
    """The certificate's identity (an email or a workflow URI); empty unless verified."""
    issuer: str = ""
    """The OIDC issuer that vouched for the signer; empty unless verified."""
    detail: str = ""
    """Why, in words: the verifier's reason for anything but "verified"."""
    checked_at: float = 0.0

    @property
    def verified(self) -> bool:
        return self.status == "verified"


@dataclass(frozen=True)
class BlobRow:
    sha256: str
    size: int
    git_sha1: str | None
    state: str
    created_at: float


@dataclass(frozen=True)
class VariantRow:
    repo: str
    commit: str
    variant: str
    tree: str
    published_at: float


@dataclass(frozen=True)
class LiveVariantRow:
    """A published variant whose tree is live, with what the client index says about it."""

    commit: str
    variant: str
    tree: str
    metadata_id: str | None
    backend: str | None
    archs: list[str]
    provenance: ProvenanceRecord | None = None


@dataclass(frozen=True)
class RefRow:
    repo: str
    ref: str
    commit: str
    fetched_at: float


@dataclass(frozen=True)
class DenyRow:
    repo: str
    revision: str
    reason: str
    created_at: float


@dataclass(frozen=True)
class PinRow:
    repo: str
    revision: str
    variant: str
    created_at: float


@dataclass(frozen=True)
class LeaseRow:
    id: str
    tree: str
    holder: str
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class NegativeRow:
    repo: str
    revision: str
    variant: str
    reason: str
    created_at: float
    expires_at: float


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
        archs=json.loads(row["archs"]),
        state=row["state"],
        created_at=row["created_at"],
        last_resolved=row["last_resolved"],
    )


def _blob(row: sqlite3.Row) -> BlobRow:
    return BlobRow(row["sha256"], row["size"], row["git_sha1"], row["state"], row["created_at"])


class Index:
    """Typed access to the SQLite index. Not thread-safe by itself: the Store serialises calls."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            if not path.exists():
                raise SchemaError(f"no store index at {path}; nothing to open read-only")
            uri = f"file:{path}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            fresh = not path.exists()
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            if fresh:
                os.chmod(path, 0o600)
        self.conn = conn
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            if not read_only:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
            self._migrate()
            if not read_only:
                for statement in _ADDITIONS:
                    conn.execute(statement)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise SchemaError(f"store index {path} is unreadable: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"store index schema version {version} is newer than this kerneld supports "
                f"({SCHEMA_VERSION}); upgrade kerneld or use a new store"
            )
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            raise SchemaError(
                f"store index schema version {version} needs a migration to {SCHEMA_VERSION}; "
                "open the store read-write once"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {target}")
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on error)."""
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            try:
                self.conn.execute("COMMIT")
            except BaseException:
                # A COMMIT that failed (disk full, I/O error) may leave the transaction open;
                # every later BEGIN would then fail even after the disk recovers.
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

    def _one(self, sql: str, args: Sequence[object] = ()) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self.conn.execute(sql, args).fetchone()
            return row

    def _all(self, sql: str, args: Sequence[object] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self.conn.execute(sql, args).fetchall())

    # meta

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

    # blobs

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

    # variants

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
        """One query for a repo's client index (no manifests: a store may hold 100,000 trees)."""
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
                json.loads(r[5]),
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

    def put_upstream_versions(
        self, conn: sqlite3.Connection, repo: str, versions: list[int]
    ) -> None:
        """Every `vN` the upstream listed for `repo` (kept as a meta row: one small list)."""
        self.set_meta(conn, f"upstream-versions/{repo}", json.dumps(sorted(set(versions))))

    def upstream_versions(self, repo: str) -> list[int] | None:
        raw = self.get_meta(f"upstream-versions/{repo}")
        return None if raw is None else [int(v) for v in json.loads(raw)]

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

    # pins / denies

    def pins(self) -> list[PinRow]:
        return [PinRow(r[0], r[1], r[2], r[3]) for r in self._all("SELECT * FROM pins ORDER BY 1")]

    @staticmethod
    def put_pin(conn: sqlite3.Connection, repo: str, revision: str, variant: str) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO pins VALUES (?,?,?,?)", (repo, revision, variant, time.time())
        )

    @staticmethod
    def delete_pin(conn: sqlite3.Connection, repo: str, revision: str, variant: str) -> bool:
        cur = conn.execute(
            "DELETE FROM pins WHERE repo = ? AND revision = ? AND variant = ?",
            (repo, revision, variant),
        )
        return cur.rowcount > 0

    def denies(self, repo: str | None = None) -> list[DenyRow]:
        if repo is None:
            rows = self._all("SELECT * FROM denies ORDER BY repo, revision")
        else:
            rows = self._all("SELECT * FROM denies WHERE repo = ? ORDER BY revision", (repo,))
        return [DenyRow(r[0], r[1], r[2], r[3]) for r in rows]

    @staticmethod
    def put_deny(conn: sqlite3.Connection, repo: str, revision: str, reason: str) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO denies VALUES (?,?,?,?)", (repo, revision, reason, time.time())
        )

    @staticmethod
    def delete_deny(conn: sqlite3.Connection, repo: str, revision: str) -> bool:
        cur = conn.execute("DELETE FROM denies WHERE repo = ? AND revision = ?", (repo, revision))
        return cur.rowcount > 0

    # leases

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
    def touch_trees(conn: sqlite3.Connection, touches: Sequence[tuple[str, float]]) -> None:
        """Record resolve times ``(tree, unix time)`` (LRU), never moving one backwards."""
        conn.executemany(
            "UPDATE trees SET last_resolved = ? WHERE digest = ? AND last_resolved < ?",
            [(at, tree, at) for tree, at in touches],
        )

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

    # negative cache

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
