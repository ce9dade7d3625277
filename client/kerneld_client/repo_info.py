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
from typing import Any

__all__ = ["RepoInfo", "loaded_kernel_fields"]


@dataclass(frozen=True)
class RepoInfo:
    """The Hub repository of a loaded kernel and the commit it was loaded at (`kernels`
    0.18+ names the commit; 0.17 named the revision the loader resolved, also the commit)."""

    repo_id: str
    revision: str


@functools.cache
def loaded_kernel_fields() -> dict[str, Any]:
    """`LoadedKernel.__dataclass_fields__`: `kernels`' fields in its order (metadata, module,
    repo_info), so `dataclasses.fields`, `is_dataclass` and `asdict` read a LoadedKernel as
    they read `kernels`' (`dataclasses.replace` fails: only the loader makes one)."""
    names = [("metadata", "Metadata"), ("module", "ModuleType"), ("repo_info", "RepoInfo")]
    shadow = dataclasses.make_dataclass("LoadedKernel", names, frozen=True)
    return dict(vars(shadow)["__dataclass_fields__"])
