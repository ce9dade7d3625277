"""Space accounting: what the store occupies, what writes in flight have reserved, and the
reservation every write makes first, against the size cap and the free-space watermark, so a
download that cannot fit is refused before a byte is written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ResourceExhaustedError
from .state import StoreState

log = logging.getLogger("kerneld.store")


@dataclass(frozen=True)
class Usage:
    bytes_used: int
    bytes_reserved: int
    cap_bytes: int | None
    free_bytes: int
    min_free_bytes: int
    blobs: int
    trees: int


class Space:
    """The reservations of writes in flight, checked against the cap and the free space."""

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self.reserved = 0
        """Bytes reserved by writes in flight (under the store lock)."""
        self.make_room: Callable[[int], object] | None = None
        """What a reservation that does not fit tries once: a GC run that has to leave room for
        its bytes (None: auto-GC is off, refuse at once)."""

    def free_bytes(self) -> int:
        """Free space of the store's file system, as an unprivileged writer sees it."""
        st = os.statvfs(self._state.layout.base)
        return st.f_bavail * st.f_frsize

    def reserve(self, n: int, ctx: dict[str, str | None]) -> None:
        """Reserve ``n`` bytes or raise ResourceExhaustedError; when they do not fit,
        `make_room` gets one chance first."""
        state = self._state
        with state.lock:
            for attempt in (0, 1):
                policy = state.policy
                used = state.index.usage() + self.reserved
                cap = policy.cap_bytes
                free = self.free_bytes() - self.reserved
                over_cap = cap is not None and used + n > cap
                low_free = free - n < policy.min_free_bytes
                if not over_cap and not low_free:
                    self.reserved += n
                    return
                if attempt == 0 and self.make_room is not None:
                    log.info("reserving %d bytes needs space: running GC", n)
                    self.make_room(n)
                    continue
                if over_cap:
                    assert cap is not None
                    raise ResourceExhaustedError(n, max(0, cap - used), "size cap", **ctx)
                raise ResourceExhaustedError(
                    n, max(0, free - policy.min_free_bytes), "free-space watermark", **ctx
                )

    def unreserve(self, n: int) -> None:
        with self._state.lock:
            self.reserved = max(0, self.reserved - n)

    def usage(self) -> Usage:
        state = self._state
        with state.lock:
            return Usage(
                bytes_used=state.index.usage(),
                bytes_reserved=self.reserved,
                cap_bytes=state.policy.cap_bytes,
                free_bytes=self.free_bytes(),
                min_free_bytes=state.policy.min_free_bytes,
                blobs=state.index.count("blobs", "live"),
                trees=state.index.count("trees", "live"),
            )
