"""atheris target: the HTTP front of the Hub endpoint and the metrics listener
(`kerneld.server.fronts.httpfront.httpd`, `httphead`) with the endpoint's own request parsing
(`kerneld.server.fronts.hubapi.server`: routes, ranges). Input: the bytes a client sends on one
connection."""

from __future__ import annotations

from collections.abc import Mapping

from _harness import Target, run


def make() -> tuple[Target, Mapping[str, bytes]]:
    from tests.fuzz.http_front import FrontHarness

    harness = FrontHarness()
    seeds = {
        "info": b"GET /api/kernels/org/name/revision/v1 HTTP/1.1\r\nHost: k\r\n\r\n",
        "range": b"GET /kernels/org/name/resolve/main/build/v/x.so HTTP/1.1\r\n"
        b"Range: bytes=10-19\r\nConnection: close\r\n\r\n",
        "paths-info": b"POST /api/kernels/org/name/paths-info/main HTTP/1.1\r\n"
        b"Content-Length: 11\r\n\r\npaths=build",
        "bare-cr": b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
    }
    return harness.check, seeds


if __name__ == "__main__":
    run(
        "http",
        [
            "kerneld.server.fronts.httpfront.httpd",
            "kerneld.server.fronts.httpfront.httphead",
            "kerneld.server.fronts.hubapi",
        ],
        make,
    )
