"""Progress of a mirror export or import, shaped like the wire's `MirrorEvent`.

The daemon forwards these one-to-one as `MirrorEvent`s; kerneldctl renders them directly when it
works on a stopped store. Kinds: `manifest` (a kernel's manifest written or read), `blob` (bytes
of one blob copied or ingested; totals cover the whole run), `signature-ok` (a signed file
verified), `refused` (a kernel, or the whole bundle, refused: `detail` says why), `finished`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("manifest", "blob", "signature-ok", "refused", "finished")


@dataclass(frozen=True)
class MirrorProgress:
    kind: str
    repo_id: str = ""
    commit: str = ""
    variant: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    detail: str = ""
    manifests: int = 0
    blobs: int = 0
    skipped_existing: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ProgressFn = Callable[[MirrorProgress], None]


def emit(progress: ProgressFn | None, event: MirrorProgress) -> None:
    if progress is not None:
        progress(event)
