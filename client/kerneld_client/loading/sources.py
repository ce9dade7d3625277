"""Where a kernel can come from: the `Source` protocol and the `Candidate` a source finds.

A source answers "which folder would load this request?" and nothing more: it never imports.
`materialize` then takes any candidate through the same lock, trust, verify, device and import
steps, so a new source (another cache, another daemon) is one class that returns candidates.
The pipeline tries sources in order: local override, published index, daemon; the `hub`
source is the fallback policy's, not the pipeline's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kerneld_client._types import KernelRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any, Protocol

    from kerneld_client import _path_trust
    from kerneld_client.loading.context import LoadContext

    #: metadata.json of the tree being loaded -> its dependencies' modules, by repo: how the
    #: caller finds them (`kernel-depends` through the pipeline, or the daemon's order).
    DependencyLoader = Callable[[Mapping[str, Any]], dict[str, ModuleType]]

    # For type checkers only: a Protocol class costs a warm load its creation at import.
    class Source(Protocol):
        """Finds the candidate for a request, or None when it has no answer (ask the next one).

        A source raises a typed KernelError only for a final answer (denied, no variant fits this
        platform, the daemon cannot be reached)."""

        def find(self, request: KernelRequest, ctx: LoadContext) -> Candidate | None: ...


class TreeVanished(Exception):
    """The candidate's tree went away before it could be locked (GC): try the next source."""


class Candidate:
    """A folder that would answer a request.

    `root` is the trusted root the folder must lie in (the store, or this user's hub cache);
    None for a local override, the caller's own folder, which is not checked. `lock` is the
    store tree's lock file (taken for the life of the process), None outside the store.
    `dependencies` are candidates already resolved for it, in order (a daemon answer), or None
    to read them from its `kernel-depends`. `stale`: an index answer older than
    `KERNELD_REF_MAX_AGE`, loaded only when the daemon cannot be asked.
    """

    __slots__ = (
        "commit",
        "dependencies",
        "digest",
        "lock",
        "path",
        "request",
        "root",
        "source",
        "stale",
        "variant",
    )

    def __init__(
        self,
        *,
        request: KernelRequest,
        source: str,
        path: Path,
        variant: str,
        commit: str = "",
        digest: str = "",
        root: _path_trust.StoreRoot | None = None,
        lock: Path | None = None,
        dependencies: tuple[Candidate, ...] | None = None,
        stale: bool = False,
    ) -> None:
        self.request = request
        self.source = source
        self.path = path
        self.variant = variant
        self.commit = commit
        self.digest = digest
        self.root = root
        self.lock = lock
        self.dependencies = dependencies
        self.stale = stale

    def __repr__(self) -> str:
        return f"Candidate({self.source}: {self.request.repo_id}@{self.request.ref} {self.variant})"
