"""What a caller asks for (a kernel by name and revision) and what getting it can answer.

The words the resolver, the acquire path and every front end share: `KernelSpec`, the
`Resolution` a Resolve returns, and the failures that are neither upstream nor store errors.
They sit below both the resolver (refs and listings) and the acquire path (the sequence that
uses them), so neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kerneld.errors import ErrorKind, WireCode
from kerneld.pipeline.fetch import FetchResult
from kerneld.store import LookupHit
from kerneld.upstream.base import check_repo_id
from kerneld_client.variants import Decision
from kerneld_client.vocabulary import is_commit


@dataclass(frozen=True)
class KernelSpec:
    """What a caller asks for. At most one of version, revision, locked_commit."""

    repo_id: str
    version: int | None = None
    revision: str | None = None
    locked_commit: str | None = None

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)
        given = [x is not None for x in (self.version, self.revision, self.locked_commit)]
        if sum(given) > 1:
            raise ValueError("give at most one of version, revision and locked_commit")
        if self.locked_commit is not None and not is_commit(self.locked_commit):
            raise ValueError(f"locked commit must be 40 lowercase hex: {self.locked_commit!r}")
        if self.version is not None and self.version < 0:
            raise ValueError(f"version must be >= 0, got {self.version}")

    @property
    def ref(self) -> str:
        """The ref to resolve: `vN` for a version (versions are branches), else the revision."""
        if self.locked_commit is not None:
            return self.locked_commit
        if self.version is not None:
            return f"v{self.version}"
        return self.revision or "main"

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.ref}"


class ResolveError(Exception):
    """Base of resolution failures that are not upstream or store errors."""

    kind = ErrorKind.INTERNAL  # a family: each member says more

    def __init__(self, message: str, *, repo_id: str = "", revision: str = "") -> None:
        self.message = message
        self.repo_id = repo_id
        self.revision = revision
        where = "@".join(p for p in (repo_id, revision) if p)
        super().__init__(f"{where}: {message}" if where else message)


class NoVariantFits(ResolveError):
    """No variant of the commit fits the platform (each decision says why); the client raises
    its `NoCompatibleVariant`, `kernels`' name, for it."""

    kind = ErrorKind.UNSUITABLE

    def __init__(
        self,
        decisions: Sequence[Decision],
        *,
        repo_id: str,
        revision: str,
        detail: str | None = None,
    ) -> None:
        self.decisions = list(decisions)
        if detail is None:
            said = "; ".join(f"{d.variant}: {d.reason}" for d in self.decisions) or "no variants"
            detail = f"no build variant fits this platform ({said})"
        super().__init__(detail, repo_id=repo_id, revision=revision)


class FetchNotAllowed(ResolveError):
    """The kernel is not in the store and this request may not trigger a download."""

    kind = ErrorKind.DENIED
    wire_code: WireCode = "FETCH_NOT_ALLOWED"


class DependencyCycle(ResolveError):
    kind = ErrorKind.INVALID


@dataclass(frozen=True)
class Resolution:
    """A kernel resolved for one platform: its commit, the variant chosen and its tree, and
    the same for every kernel it depends on."""

    spec: KernelSpec
    commit: str
    stale: bool
    variant: str
    hit: LookupHit
    decisions: list[Decision]
    fetched: FetchResult | None = None
    dependencies: list[Resolution] = field(default_factory=list)
