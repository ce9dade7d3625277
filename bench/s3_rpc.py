"""Scenario 3: the Resolve RPC next to a bare grpcio echo on the same machine.

A real kerneld (16-thread pool, its production default) has `activation` v1 cached; a bare
grpcio server (separate process, generic unary handler that returns the request bytes, same
pool size) listens on another unix socket. Both get the same serialized ResolveRequest.

- 1 client: `--rpc-rounds` rounds of `--rpc-calls` sequential calls each, echo and kerneld
  alternating round by round; each round gives a p50, a p99 and a throughput.
- 16 clients: `--rpc-clients` persistent client processes (own channels, warmed up) released
  together by a barrier, `--rpc-per-client` calls each, per run; one run per round.

Also the daemon's RSS when idle with this one kernel (for scenario 5).
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from bench.common import fmt_stat, log, percentile, ratios, rss_mib, table
from bench.scenario import DAEMON_CONFIG, Ctx, Goal, Section
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess, clean_env

REPO = f"{ORG}/activation"
THREADS = 16

ECHO_SERVER = textwrap.dedent(
    """
    import sys
    from concurrent.futures import ThreadPoolExecutor
    import grpc
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)},
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=int(sys.argv[2])))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix:" + sys.argv[1])
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()
    """
)


def request_bytes() -> bytes:
    from kerneld_client.proto import kerneld_pb2 as pb
    from tests.daemon.rpc import facts

    req = pb.ResolveRequest(
        kernel=pb.KernelRef(repo_id=REPO, version=1),
        platform=facts(),
        allow_fetch=True,
        client="bench",
    )
    return req.SerializeToString()


def make_call(channel: Any, kind: str) -> Callable[[bytes], object]:
    """A function that sends the request bytes once (echo: raw bytes; kerneld: Resolve)."""
    if kind == "echo":
        echo = channel.unary_unary("/bench.Echo/Echo")
        return lambda data: echo(data, timeout=30)
    from kerneld_client.proto import kerneld_pb2 as pb
    from kerneld_client.proto import kerneld_pb2_grpc as pb_grpc

    stub = pb_grpc.KernelsStub(channel)
    return lambda data: stub.Resolve(pb.ResolveRequest.FromString(data), timeout=30)


def time_calls(call: Callable[[bytes], object], data: bytes, n: int) -> tuple[list[float], float]:
    lat = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        call(data)
        lat.append(time.perf_counter() - t0)
    return lat, time.perf_counter() - start


def _worker(inbox: Any, outbox: Any, barrier: Barrier) -> None:
    """A persistent client process: for each (socket, kind, n) job, warm up, wait for the
    others, time n calls, report (start, end, latencies)."""
    import grpc

    data = request_bytes()
    channels: dict[str, tuple[Any, Callable[[bytes], object]]] = {}
    while True:
        job = inbox.get()
        if job is None:
            break
        sock, kind, n = job
        if sock not in channels:
            ch = grpc.insecure_channel(f"unix:{sock}")
            channels[sock] = (ch, make_call(ch, kind))
        call = channels[sock][1]
        for _ in range(20):
            call(data)
        barrier.wait()
        start = time.perf_counter()
        lat, _ = time_calls(call, data, n)
        outbox.put((start, time.perf_counter(), lat))
    for ch, _ in channels.values():
        ch.close()


class Clients:
    """`n` client processes (spawned: the bench process has grpc loaded) reused for every run."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(n)
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.procs = [
            ctx.Process(target=_worker, args=(q, self.outbox, self.barrier), daemon=True)
            for q in self.inboxes
        ]
        for p in self.procs:
            p.start()

    def run(self, sock: str, kind: str, per_client: int) -> tuple[list[float], float]:
        """All latencies of one run and its throughput (calls / wall of the run)."""
        for q in self.inboxes:
            q.put((sock, kind, per_client))
        results = [self.outbox.get(timeout=600) for _ in self.inboxes]
        lat = [x for _, _, part in results for x in part]
        wall = max(e for _, e, _ in results) - min(s for s, _, _ in results)
        return lat, len(lat) / wall

    def close(self) -> None:
        for q in self.inboxes:
            q.put(None)
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def run(ctx: Ctx) -> Section:
    import grpc

    a = ctx.args
    work = ctx.work / "s3"
    sock_dir = Path(tempfile.mkdtemp(prefix="kd-echo-", dir="/tmp"))
    echo_sock = sock_dir / "echo.sock"
    echo = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, str(echo_sock), str(THREADS)],
        stdout=subprocess.PIPE,
        env=clean_env(),
        text=True,
    )
    assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
    data = request_bytes()
    single: dict[str, list[tuple[list[float], float]]] = {"echo": [], "kerneld": []}
    multi: dict[str, list[tuple[list[float], float]]] = {"echo": [], "kerneld": []}
    try:
        with DaemonProcess(
            work / "daemon", hub_endpoint=ctx.server.url, config=DAEMON_CONFIG
        ) as daemon:
            socks = {"echo": str(echo_sock), "kerneld": str(daemon.user_socket)}
            with grpc.insecure_channel(f"unix:{daemon.user_socket}") as ch:
                first = make_call(ch, "kerneld")(data)
            resp_size = len(first.SerializeToString())  # type: ignore[attr-defined]
            time.sleep(1.0)
            ctx.shared["rss_idle_one_kernel"] = rss_mib(daemon.pid)
            calls = {}
            channels = {k: grpc.insecure_channel(f"unix:{s}") for k, s in socks.items()}
            try:
                for kind, ch in channels.items():
                    calls[kind] = make_call(ch, kind)
                    time_calls(calls[kind], data, 200)  # warm-up
                for r in range(a.rpc_rounds):
                    for kind in ("echo", "kerneld"):
                        lat, wall = time_calls(calls[kind], data, a.rpc_calls)
                        single[kind].append((lat, len(lat) / wall))
                    log(
                        f"Resolve round {r + 1}/{a.rpc_rounds}: p50 echo "
                        f"{statistics.median(single['echo'][-1][0]) * 1e3:.3f} ms, kerneld "
                        f"{statistics.median(single['kerneld'][-1][0]) * 1e3:.3f} ms"
                    )
            finally:
                for ch in channels.values():
                    ch.close()
            if a.rpc_clients > 0:
                clients = Clients(a.rpc_clients)
                try:
                    for _ in range(a.rpc_rounds):
                        for kind in ("echo", "kerneld"):
                            multi[kind].append(clients.run(socks[kind], kind, a.rpc_per_client))
                finally:
                    clients.close()
            ctx.shared["rss_after_rpc"] = rss_mib(daemon.pid)
    finally:
        echo.terminate()
        echo.wait(10)
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return report(ctx, single, multi, len(data), resp_size)


def _stats(
    runs: list[tuple[list[float], float]],
) -> tuple[list[float], list[float], list[float]]:
    """p50 ms, p99 ms and throughput of each run (each run: latencies, calls/s)."""
    p50 = [statistics.median(lat) * 1e3 for lat, _ in runs]
    p99 = [percentile(lat, 0.99) * 1e3 for lat, _ in runs]
    return p50, p99, [tput for _, tput in runs]


def report(
    ctx: Ctx,
    single: dict[str, list[tuple[list[float], float]]],
    multi: dict[str, list[tuple[list[float], float]]],
    req_size: int,
    resp_size: int,
) -> Section:
    a = ctx.args
    sec = Section("s3", "3. Resolve RPC vs a bare grpcio echo")
    sec.settings = (
        f"1 client: {a.rpc_rounds} rounds x {a.rpc_calls} calls; {a.rpc_clients} clients: "
        f"{a.rpc_rounds} runs x {a.rpc_per_client} calls per client"
    )
    rows = []
    stats: dict[tuple[str, str], tuple[list[float], list[float], list[float]]] = {}
    for label, data in (("1 client", single), (f"{a.rpc_clients} clients", multi)):
        for kind in ("echo", "kerneld"):
            if not data[kind]:
                continue
            st = _stats(data[kind])
            stats[label, kind] = st
            what = "bare grpcio echo" if kind == "echo" else "kerneld Resolve (cached kernel)"
            rows.append(
                (
                    f"{what}, {label}",
                    sum(len(lat) for lat, _ in data[kind]),
                    fmt_stat(st[0], 3),
                    fmt_stat(st[1], 3),
                    fmt_stat(st[2], 0),
                )
            )
    ratio_rows = []
    for label in ("1 client", f"{a.rpc_clients} clients"):
        if (label, "kerneld") in stats:
            kd, ec = stats[label, "kerneld"], stats[label, "echo"]
            ratio_rows.append(
                (
                    label,
                    fmt_stat(ratios(kd[0], ec[0]), 2, "x"),
                    fmt_stat(ratios(kd[1], ec[1]), 2, "x"),
                    fmt_stat(ratios(kd[2], ec[2]), 2, "x"),
                )
            )
    sec.lines = [
        "Both servers are separate processes with a 16-thread pool on a unix socket and get "
        f"the same serialized ResolveRequest ({req_size} bytes); the echo returns it, the "
        f"daemon answers a {resp_size}-byte ResolveResponse (path, digest, lease, metadata, "
        "variant verdicts). p50/p99 per round (1 client) or per run (all clients' calls "
        "pooled); throughput = calls / wall of the round or run. Median (min-max) over "
        f"{a.rpc_rounds} round(s); ratios paired round by round.",
        "",
        *table(["server, clients", "calls", "p50 ms", "p99 ms", "throughput calls/s"], rows),
        "",
        *table(
            ["clients", "p50 kerneld / echo", "p99 kerneld / echo", "throughput kerneld / echo"],
            ratio_rows,
        ),
    ]
    kd1, ec1 = stats["1 client", "kerneld"], stats["1 client", "echo"]
    r50 = statistics.median(ratios(kd1[0], ec1[0]))
    sec.goals = [
        Goal(
            "Resolve p50 <= 1.5x a bare grpcio echo, 1 client (the daemon issue's goal)",
            r50 <= 1.5,
            f"{statistics.median(kd1[0]):.3f} ms vs {statistics.median(ec1[0]):.3f} ms: {r50:.2f}x",
        )
    ]
    return sec
