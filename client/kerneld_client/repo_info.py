"""`RepoInfo`: where a loaded kernel came from, `kernels`' frozen dataclass.

Its own module, imported only when a caller reads `LoadedKernel.repo_info`: defining a
dataclass costs about a millisecond, which the warm path does not pay.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RepoInfo"]


@dataclass(frozen=True)
class RepoInfo:
    """The Hub repository of a loaded kernel and the commit it was loaded at (`kernels`
    0.18+ names the commit; 0.17 named the revision the loader resolved, also the commit)."""

    repo_id: str
    revision: str
