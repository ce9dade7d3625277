"""The store's index: one SQLite database (WAL) that decides what is valid.

A blob or tree is valid only while it has a row in state ``live``. ``pending`` rows are written
just before a file is renamed into place and turned ``live`` right after; ``dead`` rows are
written by GC and repair before files are deleted. Opening the store finishes or undoes both
(see ``recovery``), so a crash at any instant leaves no half-valid object.

Schema changes are migrations keyed by ``PRAGMA user_version`` (``schema``). A database newer
than this code is refused (no silent downgrade).

This package is the only place with SQL. Its modules follow the tables: ``content_tables``
(blobs, trees, provenance), ``name_tables`` (variants, refs, upstream listings),
``policy_tables`` (pins, denies, the negative cache), ``lease_table`` and ``meta_table``, each a
class over the one shared connection (``database``); `Index` is their union, the one object the
store holds.
"""

from __future__ import annotations

from .content_tables import ContentTables
from .lease_table import LeaseTable
from .meta_table import MetaTable
from .name_tables import NameTables
from .policy_tables import MAX_NEGATIVE, PolicyTables
from .schema import SCHEMA_VERSION


class Index(MetaTable, ContentTables, NameTables, PolicyTables, LeaseTable):
    """Typed access to the SQLite index. Not thread-safe by itself: the Store serialises calls."""


__all__ = [
    "ALL",
    "MAX_NEGATIVE",
    "SCHEMA_VERSION",
    "BlobRow",
    "DenyRow",
    "Index",
    "LeaseRow",
    "LiveVariantRow",
    "NegativeRow",
    "PinRow",
    "ProvenanceRecord",
    "RefRow",
    "TreeRow",
    "VariantRow",
]
