"""Who owns a store, as opening it sees it: every file of a store must belong to the owner of
its root directory (layout.py, "Ownership"). A read-write open takes the owner lock, records that
owner in the index (saying so once when an admin changed it), and turns a refused file operation
into an error that names the step, the path and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import StoreError, StoreOwnershipError
from .index import Index
from .layout import DIR_MODE_PUBLIC, Layout, check_root, user_name
from .locks import OwnerLock, owner_is_running

log = logging.getLogger("kerneld.store")


def take_ownership(layout: Layout) -> tuple[OwnerLock, Index, int]:
    """Create the store's directories, take the exclusive owner lock (``StoreLockedError``
    names the holder's pid) and open the index: the owner lock, the index and the owner's uid.
    Nothing stays held when this fails."""
    uid = check_root(layout.root)
    with opening_step("create the store directory", layout.root, layout.root):
        layout.root.mkdir(mode=DIR_MODE_PUBLIC, parents=True, exist_ok=True)
    with opening_step("take the owner lock", layout.owner_lock, layout.root):
        owner = OwnerLock(layout.owner_lock)
    try:
        with opening_step("create the store's directories", layout.base, layout.root):
            layout.ensure()
        with opening_step("open the index", layout.db, layout.root):
            index = Index(layout.db)
        try:
            record_owner(index, uid)
        except BaseException:
            index.close()
            raise
    except BaseException:
        owner.release()
        raise
    return owner, index, uid


def root_owner(root: Path) -> int:
    """The uid that owns `root` (ours, when it cannot be read)."""
    try:
        return os.stat(root).st_uid
    except OSError:
        return os.geteuid()


def record_owner(index: Index, uid: int) -> None:
    """Keep the index's note of the owner in step with the root directory (informational: the
    root decides). A changed owner means an admin ran ``chown -R``: say so once."""
    recorded = index.get_meta("owner_uid")
    if recorded == str(uid):
        return
    with index.tx() as conn:
        index.set_meta(conn, "owner_uid", str(uid))
        if index.get_meta("created_at") is None:
            index.set_meta(conn, "created_at", str(time.time()))
    if recorded is not None:
        log.warning(
            "the store now belongs to %s (uid %d, the owner of its root directory), not uid %s: "
            "files still owned by the old owner show up as untrusted in `kerneldctl verify`",
            user_name(uid),
            uid,
            recorded,
        )


@contextlib.contextmanager
def opening_step(operation: str, path: Path, root: Path) -> Iterator[None]:
    """Turn a refused file operation while opening into an error that names the step, the path
    and the fix (the daemon logs it as its reason not to start)."""
    try:
        yield
    except (PermissionError, OSError) as exc:
        if isinstance(exc, StoreError) or exc.errno not in (errno.EPERM, errno.EACCES):
            raise
        where = exc.filename or path
        me = user_name(os.geteuid())
        if not root.exists():
            parent = next((p for p in root.parents if p.exists()), Path("/"))
            raise StoreOwnershipError(
                f"cannot {operation}: {exc.strerror} on {where} (running as {me}; {parent} "
                f"belongs to {user_name(root_owner(parent))}); create it for {me} as root: "
                f"`install -d -o {me} -g {me} {root}`, or give kerneld a store path it may create",
                path=str(where),
            ) from None
        raise StoreOwnershipError(
            f"cannot {operation}: {exc.strerror} on {where} (running as {me}, the store root "
            f"{root} belongs to {user_name(root_owner(root))}); every file of a store must "
            f"belong to the user that runs kerneld: as root, run `chown -R {me}: {root}`, or run "
            "kerneld as the store's owner",
            path=str(where),
        ) from None


def store_exists(root: str | os.PathLike[str]) -> bool:
    """Is there a store (its index) at `root`? For tools that must not create one."""
    return Layout(Path(root)).db.exists()


def store_in_use(root: str | os.PathLike[str]) -> bool:
    """Does a live process (a daemon) own the store at `root`? Opening it as owner would fail
    with StoreLockedError; read-only opens still work."""
    return owner_is_running(Layout(Path(root)).owner_lock)
