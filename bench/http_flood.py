"""Members' latency on the Hub endpoint's HTTP front during an outsider's connect flood
(issue 52, finding 6): side by side in one run, quiet and flooded phases interleaved.

    sudo .venv/bin/python -m bench.http_flood [--members 8] [--requests 25] [--flooders 4]
        [--phases 2] [--phase-s 4]

`kerneld.server.fronts.httpfront.httpd.HttpFront` runs in a subprocess on loopback with the daemon's
peer identification (`identify_peer`: the kernel's sock_diag at accept) and an admission that
refuses `nobody`, answering the endpoint's two kinds of request with fixed bodies (a repo info
of 1.1 KiB of JSON, a 64 KiB file). Members: `--members` root processes, each making
`--requests` requests, info and file in turn, each on a fresh connection (the accept path is
what a flood contends for). The flood: `--flooders` processes as `nobody` connect, read the
refusal (or its close) and connect again, as fast as they can, for the whole phase. Each phase
is bounded by its request count and by `--phase-s`; quiet and flooded phases alternate
`--phases` times (the machine is noisy). Prints members' p50/p95 per kind of phase, the ratio,
and the flood's connections a second. Needs root (to be `nobody`); loopback only.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import pwd
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.http_front import FrontHandler


def serve() -> None:
    """Run the front on a free loopback port; print the port, serve until killed."""
    from kerneld.server.fronts.httpfront.httpd import HttpFront
    from kerneld.server.plumbing.peers import identify_peer

    nobody = pwd.getpwnam("nobody").pw_uid
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    front = HttpFront(
        "bench",
        FrontHandler(),
        identify=identify_peer,
        admit=lambda c: (c.uid != nobody, f"uid {c.uid} is not a member"),
    )
    front.add(sock, "bench", tcp=True)
    front.start()
    print(sock.getsockname()[1], flush=True)
    threading.Event().wait()


def member(args: tuple[int, int, float]) -> list[float]:
    """One member's request times (s); a failed request counts as the phase's bound."""
    port, requests, bound_s = args
    out = []
    deadline = time.monotonic() + bound_s
    for i in range(requests):
        if time.monotonic() > deadline:
            break
        start = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=bound_s)
            conn.request("GET", "/file" if i % 2 else "/info")
            resp = conn.getresponse()
            resp.read()
            conn.close()
            ok = resp.status == 200
        except OSError:
            ok = False
        out.append(time.perf_counter() - start if ok else bound_s)
    return out


def flooder(port: int, seconds: float, counts: Any) -> None:
    """Connect as `nobody` again and again for `seconds`; count the connections."""
    pw = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.recv(256)
        except OSError:
            pass
        n += 1
    with counts.get_lock():
        counts.value += n


def phase(pool: Any, port: int, args: argparse.Namespace, flood: bool) -> tuple[list[float], float]:
    """(members' request times, flood connections a second) of one phase."""
    counts = multiprocessing.Value("q", 0)
    procs = []
    if flood:
        procs = [
            multiprocessing.Process(target=flooder, args=(port, args.phase_s, counts))
            for _ in range(args.flooders)
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)  # the flood is under way
    start = time.monotonic()
    times = [
        t
        for ts in pool.map(member, [(port, args.requests, args.phase_s)] * args.members)
        for t in ts
    ]
    for p in procs:
        p.join()
    rate = counts.value / max(args.phase_s, time.monotonic() - start) if flood else 0.0
    return times, rate


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--phases", type=int, default=2)
    parser.add_argument("--phase-s", type=float, default=4.0)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    if os.geteuid() != 0:
        print("bench.http_flood: run as root (the flood connects as nobody)", file=sys.stderr)
        return 2
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.http_flood", "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        quiet: list[float] = []
        flooded: list[float] = []
        rates: list[float] = []
        with multiprocessing.Pool(args.members) as pool:
            for _ in range(args.phases):
                quiet += phase(pool, port, args, flood=False)[0]
                times, rate = phase(pool, port, args, flood=True)
                flooded += times
                rates.append(rate)
    finally:
        server.kill()
        server.wait()
    q50, q95 = statistics.median(quiet), pct(quiet, 95)
    f50, f95 = statistics.median(flooded), pct(flooded, 95)
    print(f"members {args.members} x {args.requests} requests a phase, {args.phases} phases each")
    print("| phase | requests | p50 ms | p95 ms |")
    print("|---|---:|---:|---:|")
    print(f"| quiet | {len(quiet)} | {q50 * 1e3:.1f} | {q95 * 1e3:.1f} |")
    print(
        f"| outsider flood ({statistics.mean(rates):.0f} connections/s, {args.flooders} procs) "
        f"| {len(flooded)} | {f50 * 1e3:.1f} | {f95 * 1e3:.1f} |"
    )
    print(f"| flood / quiet | | {f50 / q50:.2f}x | {f95 / q95:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
