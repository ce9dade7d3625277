"""`RepoInfo`: where a loaded kernel came from, `kernels`' frozen dataclass; and the fields
`dataclasses` sees on kerneld's LoadedKernel, those of `kernels`' dataclass.

Its own module, imported only when a caller reads `LoadedKernel.repo_info` or asks
`dataclasses` about a LoadedKernel: defining a dataclass costs about a millisecond, which the
warm path does not pay.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

__all__ = ["RepoInfo", "kernels_loaded_kernel"]


@dataclass(frozen=True)
class RepoInfo:
    """The Hub repository of a loaded kernel and the commit it was loaded at (`kernels`
    0.18+ names the commit; 0.17 named the revision the loader resolved, also the commit)."""

    repo_id: str
    revision: str


@functools.cache
def kernels_loaded_kernel() -> type:
    """A dataclass of `kernels`' LoadedKernel fields in its order (metadata, module, repo_info),
    frozen as its is: kerneld's LoadedKernel answers `dataclasses` with its fields and params,
    so `fields`, `is_dataclass` and `asdict` read one as they read `kernels`'
    (`dataclasses.replace` fails: only the loader makes one)."""
    names = [("metadata", "Metadata"), ("module", "ModuleType"), ("repo_info", "RepoInfo")]
    return dataclasses.make_dataclass("LoadedKernel", names, frozen=True)
