"""`report_suspect`: a job tells the host's kerneld that a kernel tree looks damaged.

Why: the daemon scrubs its store weekly; a job that sees a kernel misbehave (or, under
`KERNELD_VERIFY=1`, finds its bytes changed: the loader reports that by itself) should not have
to wait for the scrub, nor let the next job meet the same damage. The daemon never takes the
job's word for it: it re-hashes the tree against its own manifest and acts only on damage it
confirms (quarantine, then a re-fetch from the upstreams).

Standard library only at import; grpc is imported by `_rpc` when the report is sent.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kerneld_client import locations
from kerneld_client._types import SuspectReport

__all__ = ["report_suspect", "tree_digest_of"]

_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
#: A store tree's directory (layout.py): <store>/v1/trees/<64 hex>/...
_TREES = "trees"


def tree_digest_of(path_or_digest: str | os.PathLike[str]) -> str:
    """ "sha256:<hex>" of a tree digest, or of the store tree that holds a path (the tree's
    folder, any file in it such as a kernel module's `__file__`); ValueError when it names
    neither."""
    text = os.fspath(path_or_digest)
    match = _DIGEST.fullmatch(text)
    if match is not None:
        return f"sha256:{match.group(1)}"
    for candidate in (Path(text), Path(os.path.realpath(text))):
        parts = candidate.parts
        for i in range(1, len(parts)):
            if parts[i - 1] == _TREES and _DIGEST.fullmatch(parts[i]) and len(parts[i]) == 64:
                return f"sha256:{parts[i]}"
    raise ValueError(
        f"{text!r} is neither a tree digest ('sha256:<64 hex>') nor a path inside a kerneld "
        "store tree (<store>/v1/trees/<digest>/...)"
    )


def report_suspect(
    path_or_digest: str | os.PathLike[str],
    *,
    reason: str = "",
    repo_id: str = "",
    commit: str = "",
    variant: str = "",
    timeout: float | None = None,
) -> SuspectReport:
    """Tell the host's kerneld that a store tree looks damaged; returns its verdict.

    `path_or_digest`: the tree's digest, its folder (`LoadedKernel.path`) or a file in it
    (`module.__file__`). `reason` (one line, clipped to 512 bytes) and `repo_id`/`commit`/
    `variant` go into the daemon's log and the quarantine entry; they decide nothing. The
    daemon re-hashes the tree and answers with its own finding (`SuspectReport.verdict`:
    "intact", "damaged", "unknown"; "rate-limited" or "unavailable" when it gave none).

    Best effort: waits about `timeout` (default KERNELD_TIMEOUT, 1 s) at most and raises
    nothing for a daemon that is down, slow or refusing; ValueError only when
    `path_or_digest` names no tree.
    """
    digest = tree_digest_of(path_or_digest)
    from kerneld_client import _rpc

    return _rpc.report_suspect(
        locations.default_socket(),
        digest,
        repo_id=repo_id,
        commit=commit,
        variant=variant,
        reason=reason,
        timeout=timeout,
    )
