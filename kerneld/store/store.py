"""The :class:`Store`: one object that owns a store directory, composed of its parts.

The work is done by small parts, each with only the dependencies it uses (``state`` lists what
they share), and each held as a public attribute typed by its protocol in ``interfaces``:
``blobs`` (ingest), ``trees`` (publishing), ``names`` (refs, upstream facts, the negative
cache, pins, denies), ``catalog`` (lookups and listings), ``leases``, ``gc`` (the collector),
``repair``, ``quarantine``, ``space``, ``published`` (the published index and its documents),
``signatures`` (provenance), ``meta`` and ``scrub``. A caller names the part
(``store.names.deny(...)``). This module opens and closes the store; it forwards nothing.
`open_store` is the one constructor the daemon and kerneldctl use (the seam for a second backend).

Thread-safe: every index access and every rename into or out of ``blobs/``/``trees/`` happens
under one in-process lock; hashing, downloads, staging builds and file deletion happen outside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from . import gc as gc_mod
from .collector import Collector
from .holds import Holds
from .index import Index
from .ingest import Ingest
from .interfaces import (
    Blobs,
    Capacity,
    Catalog,
    Collection,
    ExportSource,
    Facts,
    FetchTarget,
    ImportTarget,
    InventorySource,
    Leases,
    Policy,
    PrefetchTarget,
    Provenance,
    PublishedIndex,
    PublishTarget,
    QuarantineArea,
    Repair,
    ReportTarget,
    ResolveTarget,
    Scrubbing,
    ScrubTarget,
    ServingView,
    Status,
    StoreHandle,
    Trees,
)
from .layout import Layout, write_cachedir_tag
from .leasing import LeaseManager
from .locks import OwnerLock, owner_is_running
from .lookup import Lookups
from .meta import Meta
from .names import Names
from .ownership import opening_step, root_owner, take_ownership
from .picks import Picker
from .published_index_writer import PublishedIndexWriter
from .publishing import Publisher
from .quarantine import Quarantine
from .recovery import recover
from .repair import Repairer
from .scrub import Scrub
from .signatures import Signatures
from .space import Space
from .state import StoreState
from .types import ProvenanceCheck
from .verify import DEFAULT_QUARANTINE_MAX_BYTES

if TYPE_CHECKING:
    from kerneld_client.variants import PlatformFacts

log = logging.getLogger("kerneld.store")


class Store:
    """A content-addressed store of blobs and read-only variant trees (see ``layout``)."""

    def __init__(
        self,
        layout: Layout,
        index: Index,
        owner: OwnerLock | None,
        policy: gc_mod.GcPolicy,
        *,
        require_metadata_digest: bool,
        use_hardlinks: bool,
        auto_gc: bool,
        partial_grace_s: float,
        owner_uid: int | None = None,
    ) -> None:
        self.layout = layout
        self.index = index
        self.root: Path = layout.root
        self.read_only = owner is None
        self.require_metadata_digest = require_metadata_digest
        self.use_hardlinks = use_hardlinks
        self.auto_gc = auto_gc
        self.partial_grace_s = partial_grace_s
        self._owner = owner
        self._state = state = StoreState(layout, index, self.read_only, policy)
        self.holds = Holds()
        """Variants requests in flight keep from GC until they answered (see ``holds``)."""
        self.owner_uid = root_owner(layout.root) if owner_uid is None else owner_uid
        """Every file of the store must belong to this uid: the owner of the root directory
        (layout.py, "Ownership"), so a ``chown -R`` of the store is all a change of owner needs."""
        self._writer = writer = PublishedIndexWriter(state)
        space = Space(state)
        self._collector = collector = Collector(state, space, self.holds, writer.publish)
        if auto_gc:
            space.make_room = lambda n: collector.collect(dry_run=False, extra_bytes=n)
        names = Names(state, writer)
        signatures = Signatures(state, writer, names.resolve_revision)
        ingest = Ingest(state, space)
        leases = LeaseManager(state)
        publisher = Publisher(
            state,
            space=space,
            names=names,
            signatures=signatures,
            writer=writer,
            move_to_trash=collector.move_to_trash,
            require_metadata_digest=require_metadata_digest,
            use_hardlinks=use_hardlinks,
        )
        quarantine = Quarantine(state, ingest, publisher)
        catalog = Lookups(state, names, signatures, leases)
        repair = Repairer(
            state,
            quarantine=quarantine,
            collector=collector,
            writer=writer,
            owner_uid=self.owner_uid,
        )
        meta = Meta(state)
        # The parts, each typed by the protocol its callers use (``interfaces``).
        self.blobs: Blobs = ingest
        self.trees: Trees = publisher
        self.names: Policy = names
        self.catalog: Catalog = catalog
        self.leases: Leases = leases
        self.gc: Collection = collector
        self.quarantine: QuarantineArea = quarantine
        self.repair: Repair = Repairer(
            state,
            quarantine=quarantine,
            collector=collector,
            writer=writer,
            owner_uid=self.owner_uid,
        )
        self.space: Capacity = space
        self.published: PublishedIndex = writer
        self.signatures: Provenance = signatures
        self.meta: Facts = meta
        self.scrub: Scrubbing = Scrub(
            index, layout, owner_uid=self.owner_uid, meta=meta, catalog=catalog, repair=repair
        )

    # ---- opening and closing ----

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        cap_bytes: int | None = None,
        min_free_bytes: int = 0,
        free_target_bytes: int | None = None,
        target_fraction: float = 0.9,
        min_age_s: float = 3600.0,
        orphan_grace_s: float = 3600.0,
        partial_grace_s: float = 24 * 3600.0,
        read_only: bool = False,
        require_metadata_digest: bool = False,
        use_hardlinks: bool = True,
        auto_gc: bool = True,
        client_platforms: Iterable[PlatformFacts] = (),
    ) -> Store:
        """Open (creating if needed) the store at ``root``. Read-write opens take the owner
        lock first (``StoreLockedError`` names the holder's pid), then undo what a crash left.
        ``read_only`` takes no lock and changes nothing (offline tools: exact on a stopped
        store; beside a daemon a tree GC deletes meanwhile can show up as missing)."""
        layout = Layout(Path(root))
        policy = gc_mod.GcPolicy(
            cap_bytes=cap_bytes,
            min_free_bytes=min_free_bytes,
            free_target_bytes=free_target_bytes,
            target_fraction=target_fraction,
            min_age_s=min_age_s,
            orphan_grace_s=orphan_grace_s,
        )
        options = {
            "require_metadata_digest": require_metadata_digest,
            "use_hardlinks": use_hardlinks,
            "auto_gc": auto_gc,
            "partial_grace_s": partial_grace_s,
        }
        if read_only:
            index = Index(layout.db, read_only=True)
            return cls(layout, index, None, policy, **options)  # type: ignore[arg-type]
        owner, index, uid = take_ownership(layout)
        try:
            store = cls(layout, index, owner, policy, owner_uid=uid, **options)  # type: ignore[arg-type]
            store._state.picker = Picker(client_platforms)  # before recovery republishes
            with opening_step("clean up after the last run", layout.root, layout.root):
                recover(
                    store._state, store._collector, store._writer, partial_grace_s=partial_grace_s
                )
        except BaseException:
            index.close()
            owner.release()
            raise
        log.info("opened store %s (pid %d)", layout.root, os.getpid())
        return store

    def close(self) -> None:
        with self._state.lock:
            if self._state.closed:
                return
            self._state.closed = True
            self.index.close()
            if self._owner is not None:
                self._owner.release()
        log.info("closed store %s", self.layout.root)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the store as a whole ----

    @contextlib.contextmanager
    def scratch_file(self, name: str) -> Iterator[Path]:
        """A new private file in the store's work area (its file system, so the space checks
        see it), removed at exit, or at the next open after a crash (an uploaded bundle)."""
        path = self.layout.staging / f"{name}-{secrets.token_hex(8)}"
        path.touch(mode=0o600, exist_ok=False)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def owner_is_running(self) -> bool:
        """Does a live process hold the store's owner lock (a daemon, or a CLI writing)?"""
        return owner_is_running(self.layout.owner_lock)

    def mark_as_cache(self) -> None:
        """Write `CACHEDIR.TAG` into the root (once): a user-mode store under ~/.cache is a
        cache that backups should skip, everything in it can be fetched again."""
        if not self.read_only:
            write_cachedir_tag(self.layout.cachedir_tag)


class StoreSettings(Protocol):
    """What a daemon opens its store with (kerneld.config's `Config` has each of these)."""

    @property
    def system(self) -> bool: ...

    @property
    def store_path(self) -> Path: ...

    @property
    def cap_bytes(self) -> int | None: ...

    @property
    def min_free_bytes(self) -> int: ...

    @property
    def gc_min_age_s(self) -> float: ...

    @property
    def orphan_grace_s(self) -> float: ...

    @property
    def quarantine_max_bytes(self) -> int: ...


@dataclass(frozen=True)
class ToolSettings:
    """The settings a store tool opens a store by its path with (`kerneldctl --store`): the
    store's own defaults, and no `CACHEDIR.TAG` written (`system`: the tool leaves the root's
    files as the daemon made them)."""

    store_path: Path
    system: bool = True
    cap_bytes: int | None = None
    min_free_bytes: int = 0
    gc_min_age_s: float = 3600.0
    orphan_grace_s: float = 3600.0
    quarantine_max_bytes: int = DEFAULT_QUARANTINE_MAX_BYTES


def open_store(
    cfg: StoreSettings,
    *,
    read_only: bool = False,
    client_platforms: Iterable[PlatformFacts] = (),
    provenance: ProvenanceCheck | None = None,
) -> StoreHandle:
    """A store, opened (locked, recovered; or `read_only`, without a lock) and set up from its
    settings: the one place the daemon and kerneldctl name a backend, so a second one plugs in
    here."""
    store = Store.open(
        cfg.store_path,
        cap_bytes=cfg.cap_bytes,
        min_free_bytes=cfg.min_free_bytes,
        min_age_s=cfg.gc_min_age_s,
        orphan_grace_s=cfg.orphan_grace_s,
        read_only=read_only,
        client_platforms=client_platforms,  # their picks, in the index it republishes
    )
    try:
        store.quarantine.max_bytes = cfg.quarantine_max_bytes
        store.signatures.install(provenance)
        if not cfg.system:
            store.mark_as_cache()  # ~/.cache/kerneld/store: backups skip it
    except BaseException:
        store.close()
        raise
    return store


if TYPE_CHECKING:

    def _store_implements_every_protocol(
        store: Store,
    ) -> tuple[
        StoreHandle,
        FetchTarget,
        ResolveTarget,
        PrefetchTarget,
        PublishTarget,
        ExportSource,
        Status,
        ServingView,
        ScrubTarget,
        ReportTarget,
        ImportTarget,
        InventorySource,
    ]:
        """Never called: mypy checks here that `Store` keeps satisfying each protocol."""
        return store, store, store, store, store, store, store, store, store, store, store, store
