"""The kernels this process has loaded, and the store-tree locks it holds for them.

A tree is imported once per process whatever the path to it (index, daemon, a dependency of
another kernel): `registered` and `register` are keyed by the tree's real path, and
`importing(real)` makes a second thread wait for the first import of the same tree instead of
importing it twice. The OFD read lock on a store tree is kept for the life of the process, so
the daemon's GC never removes a tree a running job has loaded.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kerneld_client import _path_trust, file_locks, locations, published_index
from kerneld_client.kernel_metadata import Metadata

if TYPE_CHECKING:
    from kerneld_client.repo_info import RepoInfo


class LoadedKernel:
    """One kernel variant loaded into this process, and where it came from.

    `source` is `index` (warm path), `daemon` (RPC path), `hub` (the hub fallback) or `local`.
    (A plain slotted class: a frozen dataclass would cost a millisecond at import.)
    """

    __slots__ = (
        "commit",
        "digest",
        "metadata",
        "module",
        "path",
        "ref",
        "repo_id",
        "source",
        "variant",
    )

    def __init__(
        self,
        *,
        repo_id: str,
        ref: str,
        commit: str,
        variant: str,
        path: Path,
        digest: str,
        module: ModuleType,
        metadata: Mapping[str, Any],
        source: str,
    ) -> None:
        self.repo_id = repo_id
        self.ref = ref
        self.commit = commit
        self.variant = variant
        self.path = path
        self.digest = digest
        self.module = module
        # `kernels`' Metadata attributes (`.name`, `.backend`...) on the parsed JSON object
        self.metadata = Metadata.of(metadata)
        self.source = source

    @property
    def module_name(self) -> str:
        return self.module.__name__

    @property
    def repo_info(self) -> RepoInfo | None:
        """The repo and the commit it was loaded at (`kernels`' field; its dataclass); None for
        a local kernel."""
        if self.source == "local":
            return None
        from kerneld_client.repo_info import RepoInfo

        return RepoInfo(self.repo_id, self.commit or self.ref)

    @property
    def provenance(self) -> published_index.Provenance | None:
        """Who signed this tree, as kerneld checked it when the tree entered the store
        (`[provenance]`); None: nothing recorded (a local or hub-fallback kernel, or a daemon
        that checks no signatures). Taken from the index entry a warm load used, else read
        from the published index when asked, so loading costs nothing more."""
        if self.source not in ("index", "daemon"):
            return None
        if self.digest in provenance_seen:  # the warm load read it already
            return provenance_seen[self.digest]
        root = store_root()
        if root is None:
            return None
        try:
            doc = published_index.read_repo_index(
                root.real_path, self.repo_id, owner_uid=root.owner_uid
            )
        except (OSError, published_index.IndexFormatError):
            return None
        commit = None if doc is None else doc.commits.get(self.commit)
        entry = None if commit is None else commit.variants.get(self.variant)
        return entry.provenance if entry is not None and entry.digest == self.digest else None

    def __repr__(self) -> str:
        return (
            f"LoadedKernel({self.repo_id}@{self.ref} commit={self.commit[:12]} "
            f"variant={self.variant} module={self.module_name} source={self.source})"
        )


#: tree digest -> who signed it, as the published index entry a warm load used said.
provenance_seen: dict[str, published_index.Provenance | None] = {}

_registry_lock = threading.Lock()
_loaded: dict[str, LoadedKernel] = {}  # by real tree path, in load order
_held: dict[str, int] = {}  # real tree path -> fd holding the OFD read lock (kept until exit)
_importing: dict[str, threading.Lock] = {}  # real tree path -> lock of its one import


def loaded_kernels() -> list[LoadedKernel]:
    """Every kernel variant loaded into this process (a new list, in load order)."""
    with _registry_lock:
        return list(_loaded.values())


def registered(real: str) -> LoadedKernel | None:
    return _loaded.get(real)


def register(real: str, loaded: LoadedKernel) -> LoadedKernel:
    """Record a load; the first registration of a tree wins."""
    with _registry_lock:
        return _loaded.setdefault(real, loaded)


@contextmanager
def importing(real: str) -> Iterator[None]:
    """Held while `real` is imported: a second thread loading the same tree waits, then finds
    it registered. Only the import is under it, never a dependency's load."""
    with _registry_lock:
        lock = _importing.setdefault(real, threading.Lock())
    with lock:
        yield


def hold(real_tree: str, lock_path: Path, tree: Path) -> bool:
    """Take the OFD read lock on a store tree for the life of the process; True if taken now
    (False: this process holds it already). Raises what `file_locks.lock_shared` raises."""
    with _registry_lock:
        if real_tree in _held:
            return False
        _held[real_tree] = file_locks.lock_shared(lock_path, tree)
        return True


def release(real_tree: str) -> None:
    """Give the lock back after a load that failed before its tree was registered."""
    with _registry_lock:
        fd = _held.pop(real_tree, None)
    if fd is not None:
        os.close(fd)


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


def _after_fork_in_child() -> None:
    """A thread of the parent may have held these at fork; the child has only this thread."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _importing.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
