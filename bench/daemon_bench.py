"""Daemon benchmark: Resolve latency over the user socket next to a bare grpcio echo, and RSS.

Run from the repository root:

    .venv/bin/python bench/daemon_bench.py [--calls 3000] [--clients 16] [--trees 10000]
                                           [--out bench/results/daemon.md]

1. A real kerneld (subprocess, `tests/support/daemon.py`, log level info) serves one cached
   kernel from a mirror; a bare grpcio server (subprocess, generic unary handler that returns
   the request bytes, same thread-pool size) runs on another unix socket. Both are called with
   the same serialized ResolveRequest; single-client p50/p99 are measured in alternating rounds,
   then 16 client processes (own channels, started together) measure p50/p99 and throughput.
2. RSS (VmRSS) of the daemon idle with that one kernel, then with 10,000 trees: a store is
   synthesised through the real Store API before the daemon starts (100 repos x 100 commits,
   one `torch-universal` variant each with a unique `__init__.py` and its `metadata.json`,
   every one ingested, verified and published like a fetch would; on tmpfs when available so
   the fsyncs do not dominate the setup), then the daemon is started on it and asked for a
   Resolve, GetStatus and a full List (which reads every row).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from kerneld.store import Store, TreeFile
from kerneld_client._proto import kerneld_pb2 as pb
from kerneld_client._proto import kerneld_pb2_grpc as pb_grpc
from tests.daemon.rpc import facts
from tests.support.daemon import DaemonProcess, clean_env
from tests.support.mirrors import variant, write_mirror

REPO = "bench/act"
COMMIT = "a" * 40
THREADS = 16

ECHO_SERVER = textwrap.dedent(
    """
    import sys, time
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def request_bytes() -> bytes:
    req = pb.ResolveRequest(
        kernel=pb.KernelRef(repo_id=REPO, version=1),
        platform=facts(),
        allow_fetch=True,
        client="bench",
    )
    return req.SerializeToString()


def make_call(channel: grpc.Channel, kind: str):
    if kind == "echo":
        return channel.unary_unary("/bench.Echo/Echo")
    stub = pb_grpc.KernelsStub(channel)
    return lambda data, timeout: stub.Resolve(pb.ResolveRequest.FromString(data), timeout=timeout)


def time_calls(socket_path: str, kind: str, n: int, warmup: int = 200) -> list[float]:
    data = request_bytes()
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        call = make_call(channel, kind)
        for _ in range(warmup):
            call(data, timeout=10)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            call(data, timeout=10)
            out.append(time.perf_counter() - t0)
    return out


def _client(args: tuple[str, str, int, object, object]) -> None:
    socket_path, kind, n, barrier, queue = args
    data = request_bytes()
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        call = make_call(channel, kind)
        for _ in range(50):
            call(data, timeout=30)
        barrier.wait()  # type: ignore[attr-defined]
        lat = []
        start = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            call(data, timeout=30)
            lat.append(time.perf_counter() - t0)
        end = time.perf_counter()
    queue.put((start, end, lat))  # type: ignore[attr-defined]


def concurrent_calls(
    socket_path: str, kind: str, clients: int, n: int
) -> tuple[list[float], float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(clients)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=((socket_path, kind, n, barrier, queue),))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    lat = [x for _, _, part in results for x in part]
    wall = max(e for _, e, _ in results) - min(s for s, _, _ in results)
    return lat, len(lat) / wall


def synthesise_store(root: Path, trees: int) -> tuple[float, int]:
    """`trees` published variants through the real Store API; returns (seconds, repos)."""
    repos = max(1, trees // 100)
    per_repo = trees // repos
    start = time.perf_counter()
    store = Store.open(root)
    tips: dict[str, str] = {}
    try:
        for r in range(repos):
            repo = f"bench/k{r:03d}"
            for c in range(per_repo):
                commit = f"{r:08x}{c:032x}"
                files = variant(f"_k{r}_{c}")
                entries = []
                for path, data in files.items():
                    sha = hashlib.sha256(data).hexdigest()
                    blob = store.ingest(data, size=len(data), sha256=sha)
                    entries.append(TreeFile(path=path, sha256=blob.sha256, size=len(data)))
                store.publish_tree(repo, commit, "torch-universal", entries)
                tips[repo] = commit
        for repo, commit in tips.items():  # last, so every ref is fresh when the daemon starts
            store.set_ref(repo, "v1", commit)
    finally:
        store.close()
    return time.perf_counter() - start, repos


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="single-client calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=500)
    parser.add_argument("--trees", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/daemon.md"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kerneld-bench-"))
    shm = Path("/dev/shm")
    big_base = Path(tempfile.mkdtemp(prefix="kerneld-bench-", dir=shm if shm.is_dir() else None))
    mirror = work / "mirror"
    write_mirror(
        mirror,
        {REPO: {COMMIT: {"torch213-cxx11-cpu-x86_64-linux": variant("_bench_cpu")}}},
        branches={REPO: {"v1": COMMIT}},
    )
    config = {"log": {"level": "info"}, "server": {"threads": THREADS}}
    lines: list[str] = []

    echo_sock = Path(tempfile.mkdtemp(prefix="kd-echo-", dir="/tmp")) / "echo.sock"
    echo = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, str(echo_sock), str(THREADS)],
        stdout=subprocess.PIPE,
        env=clean_env(),
        text=True,
    )
    assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"

    daemon = DaemonProcess(work / "daemon", mirror_dirs=[mirror], config=config)
    try:
        daemon.start()
        with daemon.kernels() as kernels:
            first = kernels.Resolve(pb.ResolveRequest.FromString(request_bytes()), timeout=30)
            assert first.kernel.fetched
        resp_size = len(first.SerializeToString())
        time.sleep(1.0)
        rss_idle = rss_mib(daemon.pid)

        single: dict[str, list[float]] = {"echo": [], "daemon": []}
        for _ in range(args.rounds):
            single["echo"] += time_calls(str(echo_sock), "echo", args.calls)
            single["daemon"] += time_calls(str(daemon.user_socket), "daemon", args.calls)
        conc: dict[str, tuple[list[float], float]] = {}
        for kind, sock in (("echo", echo_sock), ("daemon", daemon.user_socket)):
            conc[kind] = concurrent_calls(str(sock), kind, args.clients, args.per_client)
        rss_after_load = rss_mib(daemon.pid)
        daemon.stop()
    finally:
        daemon.close()
        echo.terminate()
        echo.wait(10)

    # ---- 10,000 trees -----------------------------------------------------------------------
    big_store = big_base / "store"
    seconds, repos = synthesise_store(big_store, args.trees)
    probe_repo = f"bench/k{repos // 2:03d}"
    big = DaemonProcess(work / "big", store=big_store, mirror_dirs=[mirror], config=config)
    try:
        t0 = time.perf_counter()
        big.start()
        ready_s = time.perf_counter() - t0
        time.sleep(1.0)
        rss_big_idle = rss_mib(big.pid)
        with big.kernels() as kernels, big.admin() as admin:
            status = kernels.GetStatus(pb.GetStatusRequest(), timeout=60)
            req = pb.ResolveRequest(
                kernel=pb.KernelRef(repo_id=probe_repo, version=1), platform=facts()
            )
            kernels.Resolve(req, timeout=30)
            hits = []
            for _ in range(1000):
                t = time.perf_counter()
                kernels.Resolve(req, timeout=30)
                hits.append(time.perf_counter() - t)
            t = time.perf_counter()
            listing = admin.List(pb.ListRequest(), timeout=300)
            list_s = time.perf_counter() - t
        listed = sum(len(r.variants) for k in listing.kernels for r in k.revisions)
        rss_big_after = rss_mib(big.pid)
    finally:
        big.close()

    e, d = single["echo"], single["daemon"]
    ce, cd = conc["echo"], conc["daemon"]
    ratio = statistics.median(d) / statistics.median(e)
    lines += [
        "# Daemon benchmark",
        "",
        f"Command: `.venv/bin/python bench/daemon_bench.py --calls {args.calls} --rounds "
        f"{args.rounds} --clients {args.clients} --per-client {args.per_client} --trees "
        f"{args.trees}`",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "## Resolve of a cached kernel over the user socket vs a bare grpcio echo",
        "",
        "Both servers are separate processes with a 16-thread pool on a unix socket; both get the",
        f"same serialized ResolveRequest ({len(request_bytes())} bytes); the echo returns it, the",
        f"daemon answers a {resp_size}-byte ResolveResponse (path, digest, lease, metadata, "
        "variant verdicts).",
        "",
        "| | calls | p50 ms | p99 ms | throughput calls/s |",
        "| --- | --- | --- | --- | --- |",
        f"| echo, 1 client | {len(e)} | {fmt_ms(statistics.median(e))} | "
        f"{fmt_ms(percentile(e, 0.99))} | {len(e) / sum(e):.0f} |",
        f"| kerneld Resolve, 1 client | {len(d)} | {fmt_ms(statistics.median(d))} | "
        f"{fmt_ms(percentile(d, 0.99))} | {len(d) / sum(d):.0f} |",
        f"| echo, {args.clients} client processes | {len(ce[0])} | "
        f"{fmt_ms(statistics.median(ce[0]))} | {fmt_ms(percentile(ce[0], 0.99))} | "
        f"{ce[1]:.0f} |",
        f"| kerneld Resolve, {args.clients} client processes | {len(cd[0])} | "
        f"{fmt_ms(statistics.median(cd[0]))} | {fmt_ms(percentile(cd[0], 0.99))} | "
        f"{cd[1]:.0f} |",
        "",
        f"**p50 ratio kerneld / echo (1 client): {ratio:.2f}** (goal <= 1.5). With "
        f"{args.clients} clients: "
        f"{statistics.median(cd[0]) / statistics.median(ce[0]):.2f}.",
        "",
        "## Memory",
        "",
        "| daemon state | VmRSS MiB |",
        "| --- | --- |",
        f"| idle, 1 kernel cached | {rss_idle:.1f} |",
        f"| after the latency runs above | {rss_after_load:.1f} |",
        f"| idle, {status.trees} trees in the index (ready in {ready_s:.2f} s) | "
        f"{rss_big_idle:.1f} |",
        f"| after GetStatus, 1,000 Resolves and a full List ({listed} variants, "
        f"{list_s:.2f} s) | {rss_big_after:.1f} |",
        "",
        f"Resolve p50 / p99 with {status.trees} trees in the index: "
        f"{fmt_ms(statistics.median(hits))} / {fmt_ms(percentile(hits, 0.99))} ms.",
        "",
        f"The {status.trees} trees ({status.blobs} blobs) were made through the real Store API "
        f"in {seconds:.0f} s: {repos} repos x {args.trees // repos} commits, one "
        "`torch-universal` variant per commit with a unique `__init__.py` and its "
        "`metadata.json` (ingested, verified and published as a fetch would), the store on "
        "tmpfs so the setup is not bound by fsync.",
        "",
        "## Reading the figures",
        "",
        "- A warm Resolve is answered from the daemon's memory: the remembered resolution is",
        "  reused while the store's generation counter (bumped by every ref, variant, deny, GC",
        "  or repair change) is unchanged and the refs are within their TTL; the lease is",
        "  granted at once and written to SQLite behind, once a second in one transaction.",
        "  In-process, without gRPC, a warm Resolve costs ~70 us (it was ~880 us when every",
        "  call re-ran resolution against SQLite and wrote its lease with an fsync).",
        "- The p99 gap to the echo is the once-a-second lease flush (fsync) competing for the",
        "  2 cores: flushing every 50 ms measured p99 ~4.3 ms, every 1 s ~1.1-2.2 ms.",
        "- 16 client processes and the server share 2 cores, so the concurrent figures measure",
        "  CPU contention as much as the servers; the echo's own p50 here (0.7-0.8 ms) is above",
        "  REFERENCE.md's 0.44 ms for the same reason (a busy shared machine).",
        "",
    ]
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(big_base, ignore_errors=True)
    shutil.rmtree(echo_sock.parent, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    print(json.dumps({"p50_ratio": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
