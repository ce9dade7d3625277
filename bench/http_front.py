"""The HTTP front of the Hub endpoint and the metrics listener (issue 42): which server?

    .venv/bin/python -m bench.http_front [--servers old,front,uvicorn,waitress] [--requests 40]

Each server runs alone in a subprocess on loopback, answering the endpoint's two kinds of
request with fixed bodies (a repo info of 1.1 KiB of JSON, a 64 KiB file), so that only the
HTTP layer differs:

- `old`: `http.server.ThreadingHTTPServer`, a thread per connection (the front before issue 42);
- `front`: `kerneld.server.fronts.httpfront.httpd.HttpFront` (h11 parsing, since issue 54) with
  `FrontHandler`, the same answers through the front's own `Exchange`;
- `uvicorn` (h11 parser; `h11_max_incomplete_event_size=8192`, `limit_concurrency=512`) with a
  minimal ASGI app; `waitress` (`max_request_header_size=8192`, 32 threads) with a minimal WSGI
  app. (`pip install waitress` first: it is not a kerneld dependency.)

Latency: N client processes (1 and 64) each make `--requests` requests, info and file in turn,
on one keep-alive connection (as `huggingface_hub` does); per request median and p95, and the
whole wave's wall time. Attack: 12 clients send a 98-line head of 64,000 bare CRs a line
(6.3 MB) again and again for 5 s; the server's peak RSS and the slowest of a probe GET's answers
meanwhile. Loopback only; bounded in time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

INFO = json.dumps({"siblings": [{"rfilename": f"build/v/{i}.py"} for i in range(40)]}).encode()
FILE = os.urandom(64 << 10)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        if isinstance(self.client_address, tuple):  # as the old endpoint did (Nagle)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        body = FILE if self.path == "/file" else INFO
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class FrontHandler:
    """`Handler`'s answers for the front
    (`kerneld.server.fronts.httpfront.httpexchange.HttpHandler`)."""

    methods = frozenset({"GET"})

    def __call__(self, exchange: Any) -> None:
        body = FILE if exchange.target == "/file" else INFO
        exchange.respond(200, {"Content-Length": str(len(body))}, body)


class OldServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # the old endpoint's BACKLOG


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = FILE if scope["path"] == "/file" else INFO
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = FILE if environ["PATH_INFO"] == "/file" else INFO
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


def serve(kind: str) -> None:
    """Run one server on a free loopback port; print the port, serve until killed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if kind == "old":
        sock.close()
        server = OldServer(("127.0.0.1", port), Handler)
        print(port, flush=True)
        server.serve_forever()
    elif kind == "front":
        from kerneld.server.fronts.httpfront.httpd import HttpFront
        from kerneld.server.plumbing.peers import identify_peer

        front = HttpFront("bench", FrontHandler(), identify=identify_peer)
        front.add(sock, "bench", tcp=True)
        front.start()
        print(port, flush=True)
        threading.Event().wait()
    elif kind == "uvicorn":
        import uvicorn

        sock.listen(512)
        config = uvicorn.Config(
            asgi,
            http="h11",
            lifespan="off",
            log_level="warning",
            h11_max_incomplete_event_size=8192,
            limit_concurrency=512,
            timeout_keep_alive=30,
            backlog=512,
        )
        print(port, flush=True)
        uvicorn.Server(config).run(sockets=[sock])
    elif kind == "waitress":
        import waitress

        sock.listen(512)
        print(port, flush=True)
        waitress.serve(
            wsgi,
            sockets=[sock],
            threads=32,
            max_request_header_size=8192,
            channel_timeout=30,
            connection_limit=512,
            backlog=512,
            _quiet=True,
        )


def client(args: tuple[int, int]) -> list[float]:
    port, requests = args
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out = []
    for i in range(requests):
        start = time.perf_counter()
        conn.request("GET", "/file" if i % 2 else "/info")
        resp = conn.getresponse()
        resp.read()
        out.append(time.perf_counter() - start)
        assert resp.status == 200
    conn.close()
    return out


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def attack(port: int, pid: int, seconds: float = 5.0) -> tuple[int, float, int]:
    """(peak RSS KiB, slowest probe s, probes failed) under 12 bare-CR floods."""
    pad = b"".join(b"X-Pad-%d: " % i + b"\r" * 64000 + b"\r\n" for i in range(98))
    head = b"GET /info HTTP/1.1\r\nHost: b\r\n" + pad + b"\r\n"
    deadline = time.monotonic() + seconds
    stop = threading.Event()

    def flood() -> None:
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(head)
                    s.recv(1024)
            except OSError:
                pass

    threads = [threading.Thread(target=flood) for _ in range(12)]
    for t in threads:
        t.start()
    peak, slowest, failed = 0, 0.0, 0

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                peak = max(peak, rss_kib(pid))
            except OSError:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            client((port, 1))
        except (OSError, AssertionError):
            failed += 1
        slowest = max(slowest, time.perf_counter() - start)
        time.sleep(0.2)
    for t in threads:
        t.join()
    stop.set()
    sampler.join()
    return peak, slowest, failed


def measure(kind: str, ranks: list[int], requests: int) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.http_front", "--serve", kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        client((port, 4))  # warm-up
        row: dict[str, Any] = {"server": kind, "rss_idle": rss_kib(proc.pid)}
        for n in ranks:
            count = requests * 10 if n == 1 else requests
            with multiprocessing.get_context("fork").Pool(n) as pool:
                start = time.perf_counter()
                waves = pool.map(client, [(port, count)] * n)
                row[f"wall_{n}"] = time.perf_counter() - start
            times = sorted(t for wave in waves for t in wave)
            row[f"p50_{n}"] = statistics.median(times)
            row[f"p95_{n}"] = times[int(len(times) * 0.95)]
        row["rss_attack"], row["probe_max"], row["probe_failed"] = attack(port, proc.pid)
        row["alive"] = proc.poll() is None
        return row
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--servers", default="old,front,uvicorn,waitress")
    ap.add_argument("--ranks", default="1,64")
    ap.add_argument("--requests", type=int, default=40, help="per client at N > 1 (x10 at N=1)")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    ranks = [int(n) for n in args.ranks.split(",")]
    print("| server | " + " | ".join(f"N={n} p50 / p95 ms, wall s" for n in ranks), end="")
    print(" | RSS idle MiB | RSS peak under attack MiB | slowest probe s (failed) |")
    print("| --- " * (len(ranks) + 4) + "|")
    for kind in args.servers.split(","):
        r = measure(kind, ranks, args.requests)
        cells = [
            f"{r[f'p50_{n}'] * 1e3:.2f} / {r[f'p95_{n}'] * 1e3:.2f}, {r[f'wall_{n}']:.2f}"
            for n in ranks
        ]
        print(
            f"| {kind} | "
            + " | ".join(cells)
            + f" | {r['rss_idle'] / 1024:.0f} | {r['rss_attack'] / 1024:.0f}"
            + f" | {r['probe_max']:.2f} ({r['probe_failed']}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
