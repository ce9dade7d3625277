"""What the gRPC front ends use of the daemon, each as a small protocol (the wiring's `Core`
implements them all): a servicer names what it reads and calls, and never holds `Core` itself,
so `kerneld/server/core.py` is imported by the wiring alone (tests/test_structure.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.hardware import Hardware
from kerneld.pipeline.prefetch import Emit, Prefetcher, PrefetchSummary
from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.pipeline.upstreams import TrackedUpstream
from kerneld.server.fronts.rpc.mirror_rpc import MirrorHost, MirrorStore
from kerneld.server.fronts.rpc.suspect import SuspectHost
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.services.fetch_history import FetchRecord
from kerneld.server.services.leases import LeaseBook
from kerneld.server.services.serving import Serving
from kerneld.store import (
    Capacity,
    Catalog,
    Collection,
    InventorySource,
    Policy,
    PublishedIndex,
    QuarantineArea,
    Repair,
)
from kerneld_client.variants import PlatformFacts


class StatusHost(Protocol):
    """What GetStatus reports of the daemon (the wiring's `Core` implements it)."""

    @property
    def config(self) -> Config: ...

    @property
    def ready(self) -> bool: ...

    @property
    def started_at(self) -> float: ...

    @property
    def hub_api(self) -> Sequence[str]: ...

    @property
    def listener_problems(self) -> Sequence[str]: ...

    @property
    def upstreams(self) -> Sequence[TrackedUpstream]: ...

    @property
    def hardware(self) -> Hardware | None: ...

    @property
    def space(self) -> Capacity: ...

    @property
    def published(self) -> PublishedIndex: ...

    @property
    def prefetcher(self) -> Prefetcher: ...


class KernelsHost(StatusHost, SuspectHost, Protocol):
    """What the Kernels service uses of the daemon: its status, serving (Resolve, ListVariants,
    leases), the shared pool of ResolveMany, the error counters, and the suspect desk's host."""

    @property
    def serving(self) -> Serving: ...

    @property
    def pool(self) -> ThreadPoolExecutor: ...

    @property
    def metrics(self) -> Metrics: ...


class AdminStore(MirrorStore, InventorySource, Protocol):
    """The store as the Admin service hands it on: to mirror export and import, to the
    inventory (List), and to deny planning (`kerneld.store.deny_rules`)."""


class AdminHost(StatusHost, MirrorHost, Protocol):
    """What the Admin service uses of the daemon: the store's parts it changes or reports
    (names, catalog, collection, space, repair, quarantine), the resolver's refs, the lease
    book, the prefetch, the fetch history and the counters."""

    @property
    def metrics(self) -> Metrics: ...

    @property
    def store(self) -> AdminStore: ...

    @property
    def names(self) -> Policy: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def collection(self) -> Collection: ...

    @property
    def repair(self) -> Repair: ...

    @property
    def quarantine(self) -> QuarantineArea: ...

    @property
    def resolver(self) -> Resolver: ...

    @property
    def leases(self) -> LeaseBook: ...

    @property
    def fetches(self) -> Iterable[FetchRecord]: ...

    def active_leases(self) -> int: ...

    def configured_specs(self) -> list[KernelSpec]: ...

    def prefetch(
        self,
        specs: Sequence[KernelSpec],
        *,
        variants: Sequence[str] = (),
        torch_versions: Sequence[tuple[int, int]] = (),
        platforms: Sequence[PlatformFacts] = (),
        emit: Emit | None = None,
        cancel: threading.Event | None = None,
    ) -> PrefetchSummary: ...
