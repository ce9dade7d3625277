"""Scenario 2's kerneld rows only, N ranks cold then warm, optionally against another commit's
client in the same rounds: what a cold start costs over a warm one, without the minutes of the
`kernels` loaders around it (issue 56's goal: N = 64 cold within 1.25x of warm).

    .venv/bin/python -m bench.s2_ab [--ranks 64] [--runs 6] [--ab COMMIT] [--out FILE]

Each round, per client (this checkout's, and COMMIT's `client/` when given, in alternating
order): a fresh daemon with an empty store, N ranks forked together from a job zygote that
imported the client (imports outside the figure, as in scenario 2), each loading the same three
kernels (cold); then the same N again on that daemon (warm). Only the client differs between
the two: the daemon and its index are this checkout's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"  # before grpc is imported (bench/run.py)

import shutil
import tempfile
from pathlib import Path

from bench.common import base_env, fmt_stat, log, median, ratios, table
from bench.hubrepos import make_bench_hub
from bench.s1_ab import checkout_client
from bench.s2_cold import KERNELD_EXTRA, KERNELD_SETUP, REPOS
from bench.scenario import DAEMON_CONFIG
from bench.zygote import JobResult, Zygote
from examples.kernels.build import build_examples
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer


def one(
    zygote: Zygote, server: HubServer, work: Path, n: int, client: Path | None
) -> tuple[JobResult, JobResult]:
    """(cold, warm) jobs of `n` ranks on a fresh daemon, with `client` first on sys.path."""
    setup = (f"import sys\nsys.path.insert(0, {str(client)!r})\n" if client else "") + (
        KERNELD_SETUP
    )
    with DaemonProcess(work / "daemon", hub_endpoint=server.url, config=DAEMON_CONFIG) as daemon:
        env = base_env(work / "home")
        env["KERNELD_SOCKET"] = str(daemon.user_socket)
        env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
        jobs = [
            zygote.job(env=env, setup=setup, repos=REPOS, n=n, extra=KERNELD_EXTRA, server=server)
            for _ in ("cold", "warm")
        ]
    shutil.rmtree(work, ignore_errors=True)
    return jobs[0], jobs[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.s2_ab", description=__doc__)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--ab", metavar="COMMIT", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kerneld-s2ab-"))
    (work / "home").mkdir()
    clients: list[tuple[str, Path | None]] = [("this", None)]
    try:
        if args.ab:
            short, path = checkout_client(args.ab, work / "ab")
            clients.append((short, path))
        hub_root = make_bench_hub(work / "hub", build_examples())
        rows: dict[str, dict[str, list[float]]] = {
            name: {"cold": [], "warm": [], "cold_rank": [], "warm_rank": [], "req": []}
            for name, _ in clients
        }
        with HubServer(hub_root, trusted_orgs={ORG: True}) as server:
            zygote = Zygote(work / "zygote.log", base_env(work / "home"))
            try:
                for r in range(args.runs):
                    order = clients if r % 2 == 0 else clients[::-1]
                    for name, path in order:
                        cold, warm = one(zygote, server, work / f"r{r}-{name}", args.ranks, path)
                        if {s for rk in warm.ranks for s in rk.extra} != {"index"}:
                            raise RuntimeError(f"{name}: warm ranks did not load from the index")
                        row = rows[name]
                        row["cold"].append(cold.wall_s)
                        row["warm"].append(warm.wall_s)
                        row["cold_rank"].append(median(cold.durations))
                        row["warm_rank"].append(median(warm.durations))
                        row["req"].append(float(cold.hub_requests))
                        log(
                            f"run {r + 1}/{args.runs} {name}: cold {cold.wall_s:.2f} s, warm "
                            f"{warm.wall_s:.2f} s, {cold.hub_requests} Hub requests"
                        )
            finally:
                zygote.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    lines = [
        f"N = {args.ranks}, {args.runs} runs (load average at the end: {load[0]:.1f}); median "
        "(min-max); cold / warm paired within a run (same daemon).",
        "",
        *table(
            [
                "client",
                "cold wall s",
                "warm wall s",
                "cold / warm",
                "per-rank cold s",
                "per-rank warm s",
                "Hub requests (cold)",
            ],
            [
                (
                    name,
                    fmt_stat(row["cold"]),
                    fmt_stat(row["warm"]),
                    fmt_stat(ratios(row["cold"], row["warm"]), 2, "x"),
                    fmt_stat(row["cold_rank"]),
                    fmt_stat(row["warm_rank"]),
                    fmt_stat(row["req"], 0),
                )
                for name, row in rows.items()
            ],
        ),
    ]
    if args.ab:
        this, that = rows["this"], rows[clients[1][0]]
        lines += [
            "",
            f"this / {clients[1][0]}, cold wall (paired): "
            + fmt_stat(ratios(this["cold"], that["cold"]), 2, "x"),
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
