"""What the parts of a store share, and nothing else: its directory, its index, the one lock,
whether it may be changed, the site's GC policy and signature check, and the platforms whose
picks the published index carries.

`Store` is composed of small parts (ingest, publishing, names, lookups, leasing, the collector,
the quarantine, repair, ...), each holding this state and only the other parts it uses. Every index
access and every rename into or out of ``blobs/``/``trees/`` happens under ``lock``; hashing,
downloads, staging builds and file deletion happen outside it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import ReadOnlyStoreError
from .gc import GcPolicy
from .index import Index
from .layout import Layout
from .picks import Picker
from .types import ProvenanceCheck


@dataclass(eq=False)
class StoreState:
    layout: Layout
    index: Index
    read_only: bool
    policy: GcPolicy
    """The GC policy; callers replace it (``store.gc.policy``) for one collection with a target."""
    check: ProvenanceCheck | None = None
    """Who signed a variant, checked once per new tree at publish (``store.signatures.check``)."""
    picker: Picker = field(default_factory=Picker)
    """The platforms clients showed, whose picks the published index carries (``picks``)."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    closed: bool = False

    def writable(self) -> None:
        """Raise ReadOnlyStoreError unless this store may be changed (read-write and open)."""
        if self.read_only:
            raise ReadOnlyStoreError(
                "the store was opened read-only; open it read-write (as its owner, with the "
                "daemon stopped) to change it"
            )
        if self.closed:
            raise ReadOnlyStoreError("the store is closed")

    @property
    def require_signed(self) -> bool:
        """Are unverified trees refused (and left out of the published index)?"""
        return self.check is not None and self.check.required
