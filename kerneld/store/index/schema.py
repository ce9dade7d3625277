"""The index's schema, in one place: the migrations keyed by ``PRAGMA user_version`` and the
additions made since, applied when a connection is opened (`database.Database`).

A database newer than this code is refused (no silent downgrade); one older is migrated, which
needs a read-write open.
"""

from __future__ import annotations

import sqlite3

from kerneld.store.errors import SchemaError

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
#: checked at ingest (kerneld/pipeline/provenance.py); a tree's digest covers the bundle and the
#: files, so the answer belongs to the tree, whichever repo or revision publishes it. The ``state``
#: indexes find the few dead rows among many live ones: GC purges and recovery ask for them a
#: batch at a time, and each ask scanned every row (145 ms at 100,000 trees, 17 asks to purge
#: 1,000 trees). Building them on an existing 100,000-tree store takes about a second, once.
#: Denies are looked up by repo in any case (every Resolve asks; `policy_tables`).
_ADDITIONS = (
    "CREATE INDEX IF NOT EXISTS denies_repo_nocase ON denies (repo COLLATE NOCASE)",
    "CREATE INDEX IF NOT EXISTS leases_holder ON leases (holder, expires_at)",
    "CREATE INDEX IF NOT EXISTS leases_expires ON leases (expires_at)",
    "CREATE INDEX IF NOT EXISTS negative_expires ON negative (expires_at)",
    "CREATE INDEX IF NOT EXISTS trees_state ON trees (state, digest)",
    "CREATE INDEX IF NOT EXISTS blobs_state ON blobs (state, sha256)",
    """CREATE TABLE IF NOT EXISTS provenance (
        tree TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        signer TEXT NOT NULL,
        issuer TEXT NOT NULL,
        detail TEXT NOT NULL,
        checked_at REAL NOT NULL
    )""",
)


def migrate(conn: sqlite3.Connection, *, read_only: bool) -> None:
    """Bring the schema to `SCHEMA_VERSION` (SchemaError: newer than this code, or a migration
    a read-only open cannot make); a read-write open also creates the additions."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"store index schema version {version} is newer than this kerneld supports "
            f"({SCHEMA_VERSION}); upgrade kerneld or use a new store"
        )
    if version < SCHEMA_VERSION:
        if read_only:
            raise SchemaError(
                f"store index schema version {version} needs a migration to {SCHEMA_VERSION}; "
                "open the store read-write once"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    if not read_only:
        for statement in _ADDITIONS:
            conn.execute(statement)
