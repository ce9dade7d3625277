"""One progress event for getting kernels into a store, whoever reports it.

The fetcher reports a variant's files (`variant-started`, `file-progress`, `file-done`,
`variant-done`), a prefetch adds its kernels (`kernel-started`, `kernel-done`,
`kernel-failed`, `finished`), the daemon streams the prefetch's events over `Admin.Prefetch`,
and kerneldctl renders them, from that stream or from a prefetch it runs itself on a stopped
store. One type for all four, so that a field added for one reaches the others; the wire form
(`kerneld.v1.PrefetchEvent`) is converted in one place on each side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

#: What each kind means. Fetch kinds come from one variant's download; prefetch kinds from a
#: whole prefetch (a variant's `file-*` events are passed on to its prefetch with the same kind).
KINDS = (
    "variant-started",
    "file-progress",
    "file-done",
    "variant-done",
    "kernel-started",
    "kernel-done",
    "kernel-failed",
    "finished",
)


@dataclass(frozen=True)
class FetchProgress:
    """One step; the counters are cumulative within their variant (files, bytes) or their
    prefetch (kernels). `error` is the failure as the user reads it; `cause` the exception
    itself, on the side that has it (the daemon turns it into the stream's error detail)."""

    kind: str
    repo_id: str = ""
    commit: str = ""
    variant: str = ""
    _: KW_ONLY
    upstream: str = ""
    path: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    tree_digest: str = ""
    already_present: bool = False
    stale: bool = False
    kernels_ok: int = 0
    kernels_failed: int = 0
    error: str = ""
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    @classmethod
    def failed(cls, repo_id: str, commit: str, variant: str, exc: BaseException) -> FetchProgress:
        """`kernel-failed` for `exc`."""
        return cls("kernel-failed", repo_id, commit, variant, error=str(exc), cause=exc)


FetchProgressFn = Callable[[FetchProgress], None]
