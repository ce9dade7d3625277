"""What the acquire path gets of a kernel: its plans, and what each plan hands back.

`Best` is Resolve's (the variant a platform loads, and its dependencies), `Listed` prefetch's
(a set chosen from the commit's listing, each variant's outcome on its own), `Named` the Hub
endpoint's and the scrub's (one variant of a commit its caller already admitted). The path
itself is `kerneld.pipeline.acquire`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kerneld.pipeline.fetch import FetchResult
from kerneld.pipeline.request import KernelSpec
from kerneld.store import LookupHit
from kerneld_client.variants import PlatformFacts

T = TypeVar("T")


@dataclass(frozen=True)
class Listing:
    """Steps 1-3: the commit a spec names now and the variants it lists."""

    spec: KernelSpec
    commit: str
    stale: bool
    names: list[str]


@dataclass(frozen=True)
class Best:
    """The variant a process with `facts` loads (`variant`: that one, if it fits), and every
    kernel it depends on: Resolve's plan. Without a fetch, the best one already here."""

    facts: PlatformFacts
    variant: str | None = None


@dataclass(frozen=True)
class Outcome:
    """One variant of a `Listed` plan: its tree (None on `error`), whether it was fetched,
    why it was planned, and the kernels it depends on."""

    variant: str
    why: str
    hit: LookupHit | None
    fetched: FetchResult | None = None
    error: Exception | None = None
    dependencies: list[KernelSpec] = field(default_factory=list)


def _nothing(_variant: str) -> None:
    return None


def _ignore(_outcome: Outcome) -> None:
    return None


@dataclass(frozen=True)
class Listed:
    """A set of variants chosen from the commit's listing (prefetch). `choose` names them, each
    with why (raise to refuse an empty set); `before` runs before each (raise to stop the set),
    `after` after each. One variant's failure does not stop the others."""

    choose: Callable[[Listing], Mapping[str, str]]
    before: Callable[[str], None] = _nothing
    after: Callable[[Outcome], None] = _ignore


@dataclass(frozen=True)
class Batch:
    """What a `Listed` plan got: the listing, and one outcome per planned variant, in order."""

    listing: Listing
    outcomes: list[Outcome]


@dataclass(frozen=True)
class Named(Generic[T]):
    """One variant of a commit its caller already listed and admitted (the Hub endpoint's bytes,
    the scrub's re-fetch): no listing and no trust question, only denies, the tree and the
    fetch. `find(repo, commit, variant)` is the store's reader that hands the tree out
    (`lookup`, `published_files`); `every_ref` also refuses the variant when any ref naming the
    commit is denied (a re-fetch nobody asked for by name)."""

    variant: str
    find: Callable[[str, str, str], T | None]
    every_ref: bool = False


@dataclass(frozen=True)
class Got(Generic[T]):
    """A `Named` plan's tree, and the fetch that brought it (None: it was here)."""

    found: T
    fetched: FetchResult | None
