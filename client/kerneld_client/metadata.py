"""`metadata.json` read one way by every reader. `kernel-depends`: the daemon's resolver (which
refuses a build whose list is malformed), `kerneldctl lock`, the metadata an RPC answer carries,
and the client loading a kernel's dependencies. Before, each read it with its own strictness: the
client skipped a bad entry and then failed inside the kernel, the CLI refused an entry naming both
a version and a revision that the daemon served.

An entry is `{"repo-id": "org/name", "version": N}` (the branch `vN`) or
`{"repo-id": "org/name", "revision": "..."}`; with both, the version wins (kernel-builder writes
one). A version is a whole number a `KernelRef` can carry (0 to 2**32-1).

`backend` (`type` and `archs`): the loader's device check, the store's published variant
list, the RPC's metadata and `kerneldctl info` all take what `backend_of` returns, so a build
whose `archs` holds a non-string is described the same way everywhere.

Stdlib only, and cheap to import: the warm path reads `backend` on every load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerneld_client.lockfile import Dependency

__all__ = ["BUILD_LAYOUT", "KERNEL_DEPENDS", "backend_of", "build_layout", "kernel_depends"]

KERNEL_DEPENDS = "kernel-depends"
#: `files` (the package's files in the variant folder, the default) or `zip` (one `<id>.zip`
#: beside metadata.json, imported with zipimport: `kernels` 0.19).
BUILD_LAYOUT = "build-layout"
BUILD_LAYOUTS = ("files", "zip")
_MAX_VERSION = 2**32 - 1


def kernel_depends(doc: Mapping[str, Any] | Any) -> list[Dependency]:
    """The dependencies `doc` (a parsed metadata.json) declares, in its order. ValueError names
    what is wrong; callers add whose metadata it was and what to do."""
    raw = doc.get(KERNEL_DEPENDS) if isinstance(doc, Mapping) else None
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"'{KERNEL_DEPENDS}' must be a list, got {type(raw).__name__}")
    return [_entry(item) for item in raw]


def _entry(item: object) -> Dependency:
    from kerneld_client.lockfile import Dependency  # not on the warm path

    shown = repr(item)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if not isinstance(item, Mapping) or not isinstance(item.get("repo-id"), str):
        raise ValueError(f"bad '{KERNEL_DEPENDS}' entry {shown}: expected a string 'repo-id'")
    version, revision = item.get("version"), item.get("revision")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"bad '{KERNEL_DEPENDS}' entry {shown}: 'version' is not an integer")
        if not 0 <= version <= _MAX_VERSION:
            raise ValueError(f"bad '{KERNEL_DEPENDS}' entry {shown}: 'version' is out of range")
        return Dependency(item["repo-id"], version=version)
    if isinstance(revision, str) and revision:
        return Dependency(item["repo-id"], revision=revision)
    raise ValueError(
        f"bad '{KERNEL_DEPENDS}' entry {shown}: it needs a 'version' or a non-empty 'revision'"
    )


def backend_of(doc: Mapping[str, Any] | Any) -> tuple[str | None, list[str]]:
    """(`backend.type`, `backend.archs`) of a parsed metadata.json: the type when it is a
    string, and the archs that are strings (none when the list is missing or not a list)."""
    backend = doc.get("backend") if isinstance(doc, Mapping) else None
    if not isinstance(backend, Mapping):
        return None, []
    btype = backend.get("type")
    archs = backend.get("archs")
    return (
        btype if isinstance(btype, str) else None,
        [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else [],
    )


def build_layout(doc: Mapping[str, Any] | Any) -> str:
    """`files` or `zip`: how the build's files are laid out (`files` when metadata.json written
    before `kernels` 0.19 does not say). ValueError for any other value: a layout this client
    does not know cannot be imported right."""
    raw = doc.get(BUILD_LAYOUT, "files") if isinstance(doc, Mapping) else "files"
    if raw not in BUILD_LAYOUTS:
        shown = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:37] + "..."
        raise ValueError(f"'{BUILD_LAYOUT}' must be one of {', '.join(BUILD_LAYOUTS)}, got {shown}")
    return str(raw)
