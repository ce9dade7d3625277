"""Who is calling: this process's caller token for the daemon, sent with every RPC.

One connect to the socket's `.cred` side-channel per process and 5 minutes gives the daemon
the kernel's word on our uid, gid and pid (SO_PEERCRED, kerneld/server/plumbing/identity.py), which
a gRPC call over the same socket cannot carry; the token names that word in each call's
metadata (`kerneld-caller`). A child after `fork()` takes its own token (the cache is keyed by
pid); a daemon without the side-channel gets anonymous calls.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from kerneld_client import _config

CALLER_METADATA = "kerneld-caller"
#: The daemon's tokens live 10 minutes; take a new one well before.
_TOKEN_REFRESH_S = 300.0
_token_lock = threading.Lock()
_token: tuple[int, str, float, str] | None = None  # (pid, socket, refresh at, token or "")


def forget_token() -> None:
    """Drop the cached token (the daemon refused it: restarted, or the token expired)."""
    global _token
    with _token_lock:
        _token = None


def caller_token(socket_path: Path) -> str | None:
    """This process's token for the daemon on `socket_path`; None where it offers none."""
    global _token
    pid, now, key = os.getpid(), time.monotonic(), str(socket_path)
    with _token_lock:
        cached = _token
    if cached is not None and cached[:2] == (pid, key) and now < cached[2]:
        return cached[3] or None
    token = ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(_config.timeout_s())
        sock.connect(key + ".cred")
        data = b""
        while len(data) < 4096 and (chunk := sock.recv(4096)):
            data += chunk
        token = data.strip().decode("ascii")
    except (OSError, UnicodeDecodeError):
        token = ""  # an older daemon, or none: calls go without (anonymous)
    finally:
        sock.close()
    refresh = _TOKEN_REFRESH_S if token else _config.backoff_s()
    with _token_lock:
        _token = (pid, key, now + refresh, token)
    return token or None


def caller_metadata(socket_path: Path) -> tuple[tuple[str, str], ...] | None:
    token = caller_token(socket_path)
    return ((CALLER_METADATA, token),) if token else None
