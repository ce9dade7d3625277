"""Who may read the store: the same people who may use the user socket.

The user socket's mode and group are the documented access control for loading kernels, but a
job loads a warm kernel straight from the published index and tree, without any RPC. If the
store were world-readable, a user outside the socket's group could still load every prefetched
kernel. So the store root follows the user socket: a socket open to every local user (mode with
"other" bits) keeps the root 0755; a socket restricted to a group makes the root 0750 with that
group (the daemon is a member, so no capability is needed to chgrp), or with the daemon's own
group when none is configured (the socket gets that group too: the DaemonSet's 0660 socket); a
socket with neither (user mode, 0600) leaves the root as it is, private by where it lives.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from kerneld.config import SocketConfig
from kerneld.server.plumbing.sockets import SocketSetupError, group_id

log = logging.getLogger("kerneld.server.access")

_OTHERS = 0o007
_GROUP = 0o070


def store_mode_for(socket: SocketConfig) -> tuple[int, str] | None:
    """(mode, group) the store root gets for this user socket; None: leave it as it is."""
    if socket.mode & _OTHERS:
        return 0o755, ""
    if socket.mode & _GROUP:
        return 0o750, socket.group  # "": the daemon's own group, the socket's too
    return None


def apply_store_access(root: Path, socket: SocketConfig) -> None:
    """Make the store root readable by exactly the users the user socket admits."""
    wanted = store_mode_for(socket)
    if wanted is None:
        return
    mode, group = wanted
    st = os.stat(root)
    try:
        if mode == 0o750:
            gid = group_id(group) if group else os.getegid()
            if st.st_gid != gid:
                os.chown(root, -1, gid)
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(root, mode)
    except PermissionError as exc:
        raise SocketSetupError(
            f"cannot give the store root {root} mode {mode:04o}"
            + (f" and group {group!r}" if group else "")
            + f" ({exc.strerror}): the daemon must own it"
            + (f" and be a member of {group!r} (SupplementaryGroups= in the unit)" if group else "")
        ) from exc
    log.info(
        "store root %s mode %04o%s: readable by the users of the user socket",
        root,
        mode,
        f" group {group}" if group else "",
    )
