"""Small store-level facts kept in the index's ``meta`` table (when the scrub last ran, the
owner's uid): a key and a short string, nothing a resolution depends on.
"""

from __future__ import annotations

from .state import StoreState


class Meta:
    """Reads and writes the store's facts (`interfaces.Facts`)."""

    def __init__(self, state: StoreState) -> None:
        self._state = state

    def get(self, key: str) -> str | None:
        return self._state.index.get_meta(key)

    def set(self, key: str, value: str | None) -> None:
        """Set (or with None delete) a small store-level fact, e.g. when the scrub last ran."""
        state = self._state
        state.writable()
        with state.lock, state.index.tx() as conn:
            if value is None:
                state.index.delete_meta(conn, key)
            else:
                state.index.set_meta(conn, key, value)
