"""The scheduled prefetch: the configured kernels (`[[prefetch]]`) at start and every interval.

The thread prefetches at start when `[prefetch] on_start` is set, then every `interval`, or
sooner when woken (a reload that changed what or when to prefetch). At shutdown `stop` ends it:
a prefetch in progress ends after its current variant (background work does not hold up a
shutdown like a client's request does). A failed run is logged and the timer goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.prefetch import Cancelled, PrefetchSummary
from kerneld.pipeline.resolve import KernelSpec
from kerneld.server.background import BackgroundThread
from kerneld.server.statuses import NotReady

log = logging.getLogger("kerneld.daemon")


class TimerHost(Protocol):
    """What the timer needs of the daemon (kerneld.server.core.Core implements it): its
    settings, the kernels they name, and the prefetch with the daemon's metrics."""

    @property
    def config(self) -> Config: ...

    def configured_specs(self) -> list[KernelSpec]: ...

    def prefetch(
        self, specs: Sequence[KernelSpec], *, cancel: threading.Event | None = None
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

    def stop(self) -> None:
        self.cancel.set()
        super().stop()

    def turn(self) -> float:
        first, self._first = self._first, False
        if not first or self.core.config.prefetch_on_start:
            specs = self.core.configured_specs()
            if specs:
                summary = self.core.prefetch(specs, cancel=self.cancel)
                log.info(
                    "scheduled prefetch done: %d kernels ok, %d failed, %d variants "
                    "fetched, %d already present",
                    summary.kernels_ok,
                    summary.kernels_failed,
                    summary.variants_fetched,
                    summary.variants_present,
                )
        return self.core.config.prefetch_interval_s

    def failed(self, exc: Exception) -> float:
        log.error("scheduled prefetch failed: %r", exc, exc_info=exc)
        return self.core.config.prefetch_interval_s
