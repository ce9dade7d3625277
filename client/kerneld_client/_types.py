"""Small value types shared by the warm path and the RPC path (no imports beyond typing).

Plain slotted classes rather than dataclasses: these modules are imported by every process that
loads a kernel, and defining a frozen dataclass costs about a millisecond each.
"""

from __future__ import annotations

__all__ = ["KernelRequest", "SuspectReport"]


class KernelRequest:
    """Which kernel: at most one of version, revision, locked_commit (none: `main`)."""

    __slots__ = ("locked_commit", "repo_id", "revision", "version")

    def __init__(
        self,
        repo_id: str,
        *,
        version: int | None = None,
        revision: str | None = None,
        locked_commit: str | None = None,
    ) -> None:
        self.repo_id = repo_id
        self.version = version
        self.revision = revision
        self.locked_commit = locked_commit

    @property
    def ref(self) -> str:
        """The ref to resolve: `vN` for a version (versions are branches), else the revision."""
        if self.locked_commit is not None:
            return self.locked_commit
        if self.version is not None:
            return f"v{self.version}"
        return self.revision or "main"

    def _key(self) -> tuple[str, int | None, str | None, str | None]:
        return (self.repo_id, self.version, self.revision, self.locked_commit)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelRequest) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"KernelRequest({self.repo_id}@{self.ref})"


class SuspectReport:
    """What the daemon answered to `report_suspect` (or why it could not be asked).

    `verdict` is the daemon's own finding, never an echo of the report: "intact" (its re-hash
    found the tree as published), "damaged" (confirmed: taken out of service and quarantined,
    its variants re-fetched in the background), "unknown" (the store serves no such tree);
    or, without a finding, "rate-limited" (too many reports from this user: retry later) or
    "unavailable" (no daemon answered within the timeout; it may still be checking).
    """

    __slots__ = ("detail", "refetch_scheduled", "remembered", "tree_digest", "verdict")

    def __init__(
        self,
        verdict: str,
        detail: str = "",
        *,
        tree_digest: str = "",
        refetch_scheduled: bool = False,
        remembered: bool = False,
    ) -> None:
        self.verdict = verdict
        self.detail = detail
        self.tree_digest = tree_digest
        self.refetch_scheduled = refetch_scheduled
        self.remembered = remembered

    def __repr__(self) -> str:
        return f"SuspectReport({self.verdict!r}, {self.detail!r})"
