"""HTTP listeners of the daemon: a unix socket path and/or a loopback HOST:PORT.

The metrics exposition and the Hub API endpoint both serve HTTP this way. A unix socket is
bound owner-only and then opened to its configured mode and group (like the RPC sockets: the
file's mode decides who may connect); a TCP port is only ever bound on loopback (the config
refuses anything else).
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kerneld.config import SocketConfig
from kerneld.server.sockets import secure, umask

log = logging.getLogger("kerneld.httpd")


#: listen(2) backlog: the 64 ranks of a job connect at once; socketserver's default of 5
#: drops the rest of the SYNs, and each dropped client waits out a 1 s (then 3 s...) retry.
BACKLOG = 512


#: Connections served at once per listener (a thread each); more are closed at accept, so a
#: client that opens thousands cannot make the daemon start thousands of threads (the unit's
#: TasksMax=512 covers these, gRPC's and the fetch workers').
MAX_CONNECTIONS = 256


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them."""

    daemon_threads = True
    request_queue_size = BACKLOG
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self._slots.acquire(blocking=False):
            return True
        log.warning(
            "%s: %d connections open; refusing another", self.server_name, self.max_connections
        )
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread (TasksMax, memory): its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class UnixHTTPServer(BoundedHTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        # HTTPServer.server_bind wants a (host, port) address; a unix socket has neither.
        self.socket.bind(self.server_address)
        self.server_name = "kerneld"
        self.server_port = 0


class LoopbackHTTPServer(BoundedHTTPServer):
    pass


class LoopbackHTTP6Server(LoopbackHTTPServer):
    address_family = socket.AF_INET6


class HttpListeners:
    """One request handler served on a unix socket and/or a loopback port, a thread each."""

    def __init__(
        self,
        name: str,
        handler: type[BaseHTTPRequestHandler],
        *,
        socket_path: Path | None,
        listen: str,
        socket: SocketConfig | None = None,
    ) -> None:
        """`socket` gives the unix socket's mode and group (default 0660, the daemon's group)."""
        self.name = name
        self.where: list[str] = []
        self.servers: list[ThreadingHTTPServer] = []
        self.socket_path = socket_path
        if socket_path is not None:
            socket_path.parent.mkdir(parents=True, exist_ok=True)
            if socket_path.is_socket():
                socket_path.unlink()
            with umask(0o177):
                unix_server: Any = UnixHTTPServer
                self.servers.append(unix_server(str(socket_path), handler))
            cfg = socket or SocketConfig(socket_path, 0o660)
            try:
                secure(socket_path, SocketConfig(socket_path, cfg.mode, cfg.group))
            except BaseException:
                self._close_all()
                raise
            self.where.append(f"unix:{socket_path}")
        if listen:
            host, _, port = listen.rpartition(":")
            bind_host = {"localhost": "127.0.0.1", "[::1]": "::1"}.get(host, host)
            server_cls: type[LoopbackHTTPServer] = (
                LoopbackHTTP6Server if ":" in bind_host else LoopbackHTTPServer
            )
            try:
                server = server_cls((bind_host, int(port)), handler)
            except BaseException:
                self._close_all()
                raise
            self.servers.append(server)
            self.where.append(f"http://{host}:{server.server_address[1]}")

    def start(self) -> None:
        for server in self.servers:
            threading.Thread(target=server.serve_forever, name=self.name, daemon=True).start()

    def _close_all(self) -> None:
        """Unbind what was bound (a start that fails half way leaves no socket behind)."""
        for server in self.servers:
            server.server_close()
        if self.socket_path is not None and self.servers:
            self.socket_path.unlink(missing_ok=True)
        self.servers.clear()

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
        self._close_all()
