"""One SQLite connection (WAL) and the few ways the index uses it: a write transaction, a
one-row and an all-rows read. The table modules build on this; `Index` is their union.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kerneld.store.errors import SchemaError

from .schema import migrate


class Database:
    """The connection every table of the index shares. Not thread-safe by itself: the Store
    serialises calls."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            if not path.exists():
                raise SchemaError(f"no store index at {path}; nothing to open read-only")
            uri = f"file:{path}?mode=ro" + ("&immutable=1" if _frozen(path) else "")
            try:
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            except sqlite3.OperationalError as exc:  # SQLite says only "unable to open"
                if not os.access(path, os.R_OK):  # the daemon's own (0600): not this user's
                    raise PermissionError(
                        errno.EACCES, os.strerror(errno.EACCES), str(path)
                    ) from None
                raise SchemaError(f"cannot open the store index {path}: {exc}") from exc
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
            migrate(conn, read_only=read_only)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise SchemaError(f"store index {path} is unreadable: {exc}") from exc
        except BaseException:
            conn.close()
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


def _frozen(path: Path) -> bool:
    """Is this index on a read-only file system with no writer's shared memory beside it (the
    store a container mounts read-only at another path, or a copy on a read-only share, of a
    stopped daemon)? SQLite cannot create the ``-shm`` file a WAL reader needs there, so the
    file is opened as immutable: nothing can change it while this file system is read-only.
    With a live daemon's ``-shm`` present, SQLite reads that one instead."""
    try:
        read_only_fs = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return read_only_fs and not path.with_name(path.name + "-shm").exists()
