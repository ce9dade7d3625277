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
from kerneld.prefetch import Cancelled, PrefetchSummary
from kerneld.resolve import KernelSpec
from kerneld.server.errors import NotReady

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


class PrefetchTimer:
    """The prefetch thread of one daemon; `wake()` after a config change, `stop()` at shutdown."""

    def __init__(self, core: TimerHost) -> None:
        self.core = core
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.cancel = threading.Event()
        """Set by `stop`: scheduled prefetches (the timer's and the ref re-checks') end."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="prefetch-timer", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self.cancel.set()
        self._wake.set()

    def _loop(self) -> None:
        first = True
        while not self._stop.is_set():
            if not first or self.core.config.prefetch_on_start:
                specs = self.core.configured_specs()
                if specs:
                    try:
                        summary = self.core.prefetch(specs, cancel=self.cancel)
                        log.info(
                            "scheduled prefetch done: %d kernels ok, %d failed, %d variants "
                            "fetched, %d already present",
                            summary.kernels_ok,
                            summary.kernels_failed,
                            summary.variants_fetched,
                            summary.variants_present,
                        )
                    except Cancelled:
                        return
                    except NotReady:
                        return
                    except Exception as exc:  # never let the timer die
                        log.error("scheduled prefetch failed: %r", exc, exc_info=exc)
            first = False
            self._wake.wait(self.core.config.prefetch_interval_s)
            self._wake.clear()
