"""The kernels this process has loaded, and the store-tree locks it holds for them.

A tree is imported once per process whatever the path to it (index, daemon, a dependency of
another kernel): `registered` and `register` are keyed by the tree's real path, and
`importing(real)` makes a second thread wait for the first import of the same tree instead of
importing it twice. The OFD read lock on a store tree is kept for the life of the process, so
the daemon's GC never removes a tree a running job has loaded. The registry itself is in
`_loads`, where the warm fast path registers its loads too; the store root's check is here.
"""

from __future__ import annotations

from kerneld_client import _path_trust, locations, published_index
from kerneld_client._loads import (
    PROVENANCE_SEEN as provenance_seen,
)
from kerneld_client._loads import (
    LoadedKernel,
    hold,
    importing,
    loaded_kernels,
    register,
    registered,
    release,
)

__all__ = [
    "LoadedKernel",
    "hold",
    "importing",
    "loaded_kernels",
    "provenance_of",
    "provenance_seen",
    "register",
    "registered",
    "release",
    "store_root",
]


def provenance_of(kernel: LoadedKernel) -> published_index.Provenance | None:
    """`LoadedKernel.provenance` of an index or daemon load: the index entry a warm load used,
    else the published index read now, so loading costs nothing more."""
    if kernel.digest in provenance_seen:  # the warm load read it already
        seen = provenance_seen[kernel.digest]
        if isinstance(seen, tuple):  # as the warm fast path keeps it
            return published_index.Provenance(*seen)
        return seen  # type: ignore[return-value]
    root = store_root()
    if root is None:
        return None
    try:
        doc = published_index.read_repo_index(
            root.real_path, kernel.repo_id, owner_uid=root.owner_uid
        )
    except (OSError, published_index.IndexFormatError):
        return None
    commit = None if doc is None else doc.commits.get(kernel.commit)
    entry = None if commit is None else commit.variants.get(kernel.variant)
    return entry.provenance if entry is not None and entry.digest == kernel.digest else None


#: (what named the store, the checked root): see `store_root`.
_root_memo: tuple[tuple[object, ...], _path_trust.StoreRoot] | None = None


def store_root() -> _path_trust.StoreRoot | None:
    """The store this process reads, checked; None when there is none on this host.

    Checked in full once per process and store, not on every load. Each load compares what
    names the store (`locations.store_identity`: $KERNELD_STORE, or the advert's inode and
    change time, which a restarted daemon renews) and the root directory itself (its inode and
    change time, which any chmod or chown moves) with what was checked; any difference is a
    full check again. What is not looked at again, the directories above the root and above
    the advert, only root or their owners can change, and both are trusted. Everything below the
    root (index documents, trees) is still checked on every load. A forked worker inherits the
    verdict: reading and checking the advert again cost such a child 0.4-0.7 ms of
    copy-on-write faults per load (`bench/s1_fork.py`)."""
    global _root_memo
    memo = _root_memo
    if memo is not None and memo[0] == locations.store_identity() and memo[1].unchanged():
        return memo[1]
    path, identity = locations.named_store()  # the advert's own fstat: no second lstat
    try:
        root = _path_trust.store_root(path)
    except FileNotFoundError:
        return None
    if identity is not None:
        _root_memo = (identity, root)
    return root
