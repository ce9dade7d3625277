"""A second loopback origin standing in for the Hub's CDN: the real Hub answers a request for an
LFS (or Xet) file with a redirect to a signed URL on another host. Objects are registered by the
Hub test server when it redirects; every request is recorded with its headers, so tests can check
what reached the CDN (the Hub token must not)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


@dataclass(frozen=True)
class CdnRequest:
    method: str
    path: str
    headers: dict[str, str]


class Cdn:
    """`url(oid)` is a fresh signed-looking URL for a registered object."""

    def __init__(self) -> None:
        self._objects: dict[str, Path] = {}
        self._lock = threading.Lock()
        self.requests: list[CdnRequest] = []
        cdn = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, *, head: bool) -> None:
                oid = urlsplit(self.path).path.strip("/")
                with cdn._lock:
                    cdn.requests.append(CdnRequest(self.command, self.path, dict(self.headers)))
                    path = cdn._objects.get(oid)
                if path is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def url(self, oid: str, path: Path) -> str:
        with self._lock:
            self._objects[oid] = path
        return f"{self.base}/{oid}?Expires=4102444800&Signature={os.urandom(8).hex()}"

    def gets(self) -> list[CdnRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == "GET"]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Cdn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
