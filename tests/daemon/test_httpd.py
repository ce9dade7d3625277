"""The daemon's HTTP listeners (metrics, Hub API): a bounded number of connection threads."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

from kerneld.server.httpd import LoopbackHTTPServer


def test_connections_beyond_the_bound_are_closed_at_accept() -> None:
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            release.wait(10)
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server_cls = type("Bounded", (LoopbackHTTPServer,), {"max_connections": 2})
    server = server_cls(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    try:
        for conn in held:
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        extra.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert extra.recv(64) == b""  # closed without an answer: no third thread
        extra.close()
        release.set()
        assert all(conn.recv(64).startswith(b"HTTP/1.0 204") for conn in held)
        # The slots come back (each when its thread ends, just after its answer).
        deadline = time.monotonic() + 5
        while True:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
                again.sendall(b"GET / HTTP/1.0\r\n\r\n")
                if again.recv(64).startswith(b"HTTP/1.0 204"):
                    break
            assert time.monotonic() < deadline, "the slots never came back"
            time.sleep(0.01)
    finally:
        release.set()
        for conn in held:
            conn.close()
        server.shutdown()
        server.server_close()
