"""What the test-Hub tests share: a plain HTTP client for the server and the paths it serves."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
from typing import Any
from urllib.parse import quote

from tests.support.hubserver import HubServer

DATA = "build/torch-universal/data.bin"  # LFS-tracked
INIT = "build/torch-universal/__init__.py"  # plain git file
HUB_DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    server: HubServer,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def resolve_path(repo: str, rev: str, path: str) -> str:
    return f"/kernels/{repo}/resolve/{quote(rev, safe='')}/{path}"
