"""Whether this process may ask the daemon now, decided without grpc.

Three reasons not to: the daemon was found down moments ago (the back-off: KERNELD_BACKOFF
seconds in which later calls do not pay for it again), nothing listens on its socket (the probe:
a plain AF_UNIX connect, microseconds), or this process was forked after grpc was imported
(by kerneld or any other library; the package notes it at each fork). The parent's gRPC threads
are not in such a child, and a lock one of them held at the fork stays held: under load,
0.3-0.8% of such children hung for ever creating a channel, before any deadline applies. gRPC's
own fork support (`GRPC_ENABLE_FORK_SUPPORT=1`) still hung and slowed every fork. Such a child
never uses gRPC: the parent's kernels and the published index still serve it.

A socket that is gone or refuses connections while its directory is there is what a restart
looks like (`systemctl restart kerneld`: the old daemon removes its sockets, the new one binds
them again within seconds): `await_socket` waits for it, bounded by KERNELD_RESTART_WAIT, so a
restart does not send jobs to PyTorch for the back-off.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import kerneld_client
from kerneld_client import _config
from kerneld_client.errors import DaemonUnavailable, group_hint

__all__ = [
    "FORKED_HINT",
    "FORKED_REASON",
    "SocketGone",
    "await_socket",
    "daemon_down_reason",
    "forked_after_grpc",
    "mark_down",
    "probe",
    "reset_backoff",
]

FORKED_REASON = (
    "this process was forked from one that had imported gRPC, which can hang for ever in a "
    "forked child; kerneld is not asked from here"
)
FORKED_HINT = (
    "load the kernel in the parent before it forks (its children reuse it without asking), or "
    "start the workers with the 'spawn' or 'forkserver' method"
)


class SocketGone(DaemonUnavailable):
    """Nothing listens on the socket: the daemon is stopped, or restarting."""


_state_lock = threading.Lock()
_down_until = 0.0
_down_reason = ""


def _after_fork_in_child() -> None:
    global _state_lock
    _state_lock = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_after_grpc() -> bool:
    """Was this process forked (it or an ancestor) after grpc had been imported?"""
    return kerneld_client._forked_after_grpc


def daemon_down_reason() -> str | None:
    """Why the daemon is being skipped right now, or None when it may be asked."""
    with _state_lock:
        if time.monotonic() < _down_until:
            return _down_reason
    return None


def mark_down(reason: str) -> None:
    """Skip the daemon for KERNELD_BACKOFF seconds, saying why."""
    global _down_until, _down_reason
    with _state_lock:
        _down_until = time.monotonic() + _config.backoff_s()
        _down_reason = reason


def reset_backoff() -> None:
    """Forget that the daemon was down (tests; a launcher that just started it)."""
    global _down_until, _down_reason
    with _state_lock:
        _down_until = 0.0
        _down_reason = ""


def probe(path: Path, timeout: float) -> None:
    """Fail fast, without grpc, if nothing can be listening on `path`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SocketGone(f"no kerneld socket at {path}", hint="is kerneld running?") from None
    except OSError as exc:
        raise DaemonUnavailable(f"cannot reach {path}: {exc}") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonUnavailable(f"{path} is not a socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
    except ConnectionRefusedError:
        raise SocketGone(
            f"nothing listens on {path} (stale socket)", hint="is kerneld running?"
        ) from None
    except PermissionError as exc:
        raise DaemonUnavailable(
            f"no permission to connect to {path}",
            hint=group_hint(st.st_gid),
        ) from exc
    except OSError as exc:
        raise DaemonUnavailable(f"cannot connect to {path}: {exc}") from exc
    finally:
        sock.close()


def await_socket(path: Path, deadline: float, timeout: float) -> None:
    """Probe `path` until something listens on it or monotonic `deadline` passes.

    Waits only where a daemon has run (the socket's directory exists: kerneld's runtime
    directory outlives restarts); raises the last probe's error when the wait is over.
    """
    pause = 0.02
    while True:
        try:
            probe(path, timeout)
            return
        except SocketGone:
            if time.monotonic() >= deadline or not path.parent.is_dir():
                raise
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.25)
