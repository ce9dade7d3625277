"""The HTTP listeners of one handler: a unix socket path and/or a loopback HOST:PORT, or the
sockets systemd passed, bound and handed to one `HttpFront`
(`kerneld/server/fronts/httpfront/httpd.py`).

A unix socket is bound owner-only and then opened to its configured mode and group (like the
RPC sockets: the file's mode decides who may connect); a TCP port is only ever bound on
loopback (the config refuses anything else). Each address is bound on its own, so that one a
squatter holds leaves the others serving (`kerneld.server.app`, SECURITY.md "Port squat").
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from kerneld.config import SocketConfig
from kerneld.server.fronts.httpfront.httpd import Admit, HttpFront, Identify
from kerneld.server.fronts.httpfront.httpexchange import HttpHandler
from kerneld.server.fronts.httpfront.httphead import HttpLimits
from kerneld.server.plumbing.activation import Inherited
from kerneld.server.plumbing.sockets import secure, umask


def _unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _shown(item: Inherited) -> str:
    where = item.describe()
    return where if item.unix_path is not None else f"http://{where}"


def _tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class HttpListeners:
    """One request handler served on a unix socket and/or a loopback port (`HttpFront`).

    Each address is bound on its own: one that cannot be bound (a port another process holds,
    a directory it may not write) is left out and listed in `failed`, and the others serve. The
    caller decides what a failure means (for the daemon: an error line, never a stop)."""

    def __init__(
        self,
        name: str,
        handler: HttpHandler,
        *,
        socket_path: Path | None,
        listen: str,
        socket: SocketConfig | None = None,
        identify: Identify,
        admit: Admit | None = None,
        limits: HttpLimits | None = None,
        inherited: Sequence[Inherited] = (),
        refused: Sequence[tuple[Inherited, str]] = (),
    ) -> None:
        """`socket` gives the unix socket's mode and group (default 0660, the daemon's group);
        `identify` names each peer at accept (`kerneld.server.plumbing.peers.identify_peer`),
        `admit` checks it. `inherited`: listening sockets systemd passed (socket activation); given,
        they are served instead of `socket_path` and `listen`, and left as systemd made them
        (mode, owner, the path itself: systemd keeps listening on them across restarts).
        `refused`: passed sockets held but not served, each with the answer its connections
        get."""
        self.name = name
        self.where: list[str] = []
        self.failed: list[str] = []
        """`"ADDRESS: why"` for each address that could not be bound."""
        self.socket_path = socket_path
        self.front = HttpFront(name, handler, identify=identify, admit=admit, limits=limits)
        for item, refusal in refused:
            self.front.add(
                item.sock, _shown(item), tcp=item.unix_path is None, listening=True, refusal=refusal
            )
        if inherited or refused:
            self.socket_path = None  # systemd's to remove, not ours
            for item in inherited:
                where = _shown(item)
                self.front.add(item.sock, where, tcp=item.unix_path is None, listening=True)
                self.where.append(where)
            return
        if socket_path is not None:
            try:
                self._bind_unix(socket_path, socket or SocketConfig(socket_path, 0o660))
            except OSError as exc:
                self.socket_path = None  # not ours: whatever is at the path stays
                self.failed.append(f"unix:{socket_path}: {exc.strerror or exc}")
        if listen:
            host, _, port = listen.rpartition(":")
            bind_host = {"localhost": "127.0.0.1", "[::1]": "::1"}.get(host, host)
            try:
                tcp = _tcp_socket(bind_host, int(port))
            except OSError as exc:
                self.failed.append(f"http://{listen}: {exc.strerror or exc}")
            else:
                where = f"http://{host}:{tcp.getsockname()[1]}"
                self.front.add(tcp, where, tcp=True)
                self.where.append(where)

    def _bind_unix(self, path: Path, cfg: SocketConfig) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_socket():
            path.unlink()
        with umask(0o177):
            unix = _unix_socket(path)
        try:
            secure(path, SocketConfig(path, cfg.mode, cfg.group))
        except BaseException:
            unix.close()
            path.unlink(missing_ok=True)
            raise
        self.front.add(unix, f"unix:{path}", tcp=False)
        self.where.append(f"unix:{path}")

    def start(self) -> None:
        self.front.start()

    def quiesce(self) -> None:
        self.front.quiesce()

    def stop(self, grace: float = 0.0) -> None:
        self.front.stop(grace)
        if self.socket_path is not None:
            with contextlib.suppress(OSError):
                if os.path.exists(self.socket_path):
                    self.socket_path.unlink()
