"""The scheduled prefetch: the configured kernels (`[[prefetch]]`) at start and every interval.

The thread prefetches at start when `[prefetch] on_start` is set, then every `interval`, or
sooner when woken (a reload that changed what or when to prefetch). At shutdown `stop` ends it:
a prefetch in progress ends after its current variant (background work does not hold up a
shutdown like a client's request does). A failed run is logged and the timer goes on.

On an import-only host (`upstream = []`) the run fetches nothing: it finds what of the
configured kernels the store holds (from imports). What it cannot serve is one warning when
that set changes (and one info line when it is empty again), not a warning per kernel per
tick: the host has no upstream, so only an import changes it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.prefetch import Cancelled, PrefetchSummary
from kerneld.pipeline.resolve import KernelSpec
from kerneld.server.services.background import BackgroundThread
from kerneld.server.statuses import NotReady

log = logging.getLogger("kerneld.daemon")


class TimerHost(Protocol):
    """What the timer needs of the daemon (kerneld.server.core.Core implements it): its
    settings, the kernels they name, and the prefetch with the daemon's metrics."""

    @property
    def config(self) -> Config: ...

    def configured_specs(self) -> list[KernelSpec]: ...

    def prefetch(
        self,
        specs: Sequence[KernelSpec],
        *,
        cancel: threading.Event | None = None,
        quiet: bool = False,
    ) -> PrefetchSummary: ...


class PrefetchTimer(BackgroundThread):
    """The prefetch thread of one daemon: at start (with `prefetch_on_start`), then every
    `prefetch_interval`, the kernels of `[prefetch]`."""

    name = "prefetch-timer"
    stop_on = (Cancelled, NotReady)

    def __init__(self, core: TimerHost) -> None:
        super().__init__()
        self.core = core
        self.cancel = threading.Event()
        """Set by `stop`: scheduled prefetches (the timer's and the ref re-checks') end."""
        self._first = True
        self._unservable: dict[str, str] = {}
        """Import-only: configured kernel -> why the store cannot serve it, as last reported."""

    def stop(self) -> None:
        self.cancel.set()
        super().stop()

    def turn(self) -> float:
        first, self._first = self._first, False
        if not first or self.core.config.prefetch_on_start:
            specs = self.core.configured_specs()
            if specs:
                import_only = self.core.config.import_only
                summary = self.core.prefetch(specs, cancel=self.cancel, quiet=import_only)
                if import_only:
                    self.report_unservable(summary)
                log.info(
                    "scheduled prefetch done: %d kernels ok, %d failed, %d variants "
                    "fetched, %d already present",
                    summary.kernels_ok,
                    summary.kernels_failed,
                    summary.variants_fetched,
                    summary.variants_present,
                )
        return self.core.config.prefetch_interval_s

    def report_unservable(self, summary: PrefetchSummary) -> None:
        """Import-only: say which configured kernels the store cannot serve, when that
        changes."""
        now = {name: str(getattr(error, "message", error)) for name, error in summary.errors}
        if now == self._unservable:
            return
        self._unservable = now
        if now:
            log.warning(
                "import-only host (no upstream): %d of the [prefetch] kernels cannot be served "
                "from the store, and this host fetches nothing: %s; import a bundle that "
                "contains them (`kerneldctl mirror export` on a host with an upstream, then "
                "`kerneldctl mirror import --from BUNDLE` here)",
                len(now),
                "; ".join(f"{name} ({why})" for name, why in sorted(now.items())),
            )
        else:
            log.info("import-only host: the store now serves every [prefetch] kernel")

    def failed(self, exc: Exception) -> float:
        log.error("scheduled prefetch failed: %r", exc, exc_info=exc)
        return self.core.config.prefetch_interval_s
