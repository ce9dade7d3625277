"""`make bench`: every benchmark scenario of kerneld in one run, written to bench/RESULTS.md.

Run from the repository root (`make bench` runs it with no arguments; `make bench
BENCH_ARGS="--quick"` passes arguments through the environment):

    .venv/bin/python -m bench.run [--quick] [--only s1,s2,...] [--out bench/RESULTS.md]
                                  [--ranks 1,8,32,64] [--runs 5] [--trees 100,10000,100000] ...

One local Hub-compatible server (tests/support/hubserver.py, 127.0.0.1) serves every scenario;
real daemons (tests/support/daemon.py) and the real `kernels` / huggingface_hub clients run
against it:

1. warm load in one fresh process (bench/s1_warm.py);
2. cold start of N ranks at once, and under a Hub rate limit (bench/s2_cold.py);
3. Resolve RPC vs a bare grpcio echo (bench/s3_rpc.py);
4. ingest of a 1 GiB variant, 5. footprint (bench/s4_ingest.py);
9. ingest of a 512 MiB variant from the site cache (nginx) at the machine's limit
   (bench/s9_site_ingest.py);
6. Resolve and GC vs the number of trees in the index (bench/s6_index.py);
7. H hosts cold-starting at once, direct, through the site cache, from a static mirror
   (bench/s7_hosts.py);
plus the layer benchmark (bench/layers_bench.py: kernelized vs PyTorch layers).

The defaults (the issue's sizes; 3 GC runs per index size) are estimated at 13-15 minutes on a
quiet 2-core machine (scenario 9 about 2 of them), most of it the N=32/64 cold starts and the
100,000-tree index; `--quick`
is a smoke test of the whole pipeline (N up to 4, 2 runs, small sizes: 2-3 minutes when quiet).
Every size has its own flag (`--help`). Writes RESULTS.md and its PNG plots next to it.
"""

from __future__ import annotations

import os

# Before anything imports grpc: its fork handlers off in this process (tests/support/daemon.py).
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import BENCH, ROOT, base_env, log, machine_facts, table, versions
from bench.hubrepos import make_bench_hub
from bench.results_file import kept_sections
from bench.scenario import Ctx, Section
from bench.zygote import Zygote
from examples.kernels.build import build_examples
from examples.kernels.specs import ORG
from tests.support.hubserver import HubServer

# Each profile: what the issue asks for (full), and a smoke test (quick).
FULL: dict[str, object] = {
    "ranks": "1,8,32,64",
    "runs": 5,
    "warm_runs": 5,
    "rtt_ms": 50.0,
    "budget_ranks": 32,
    "budget": 50,
    "budget_window": 5.0,
    "budget_deadline": 20.0,
    "rpc_calls": 500,
    "rpc_rounds": 5,
    "rpc_clients": 16,
    "rpc_per_client": 100,
    "ingest_mib": 1024,
    "ingest_runs": 5,
    "site_mib": "128,512",
    "site_runs": 3,
    "revision_mib": 100,
    "trees": "100,10000,100000",
    "index_runs": 5,
    "gc_runs": 3,
    "resolve_calls": 500,
    "layers_steps": 10,
    "hosts": "1,4,16",
}
QUICK: dict[str, object] = {
    **FULL,
    "ranks": "1,2,4",
    "runs": 2,
    "warm_runs": 2,
    "budget_ranks": 4,
    "budget": 50,
    "budget_window": 5.0,
    "budget_deadline": 12.0,
    "rpc_calls": 200,
    "rpc_rounds": 2,
    "rpc_clients": 4,
    "rpc_per_client": 50,
    "ingest_mib": 64,
    "ingest_runs": 2,
    "site_mib": "16,64",
    "site_runs": 2,
    "revision_mib": 10,
    "trees": "100,1000",
    "index_runs": 2,
    "gc_runs": 2,
    "resolve_calls": 100,
    "layers_steps": 5,
    "hosts": "1,2",
}
SCENARIOS = ("s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "layers")
HELP = {
    "ranks": "scenario 2: comma-separated N",
    "runs": "scenario 2: runs per N",
    "warm_runs": "scenario 1: runs per loader",
    "rtt_ms": "scenario 1: latency added to every Hub request for the RTT row",
    "budget_ranks": "scenario 2 under a rate limit: N (0: skip)",
    "budget": "... requests served per window",
    "budget_window": "... window in seconds",
    "budget_deadline": "... ranks still loading this long after the release are stopped",
    "rpc_calls": "scenario 3: calls per single-client round",
    "rpc_rounds": "scenario 3: rounds (and concurrent runs)",
    "rpc_clients": "scenario 3: concurrent client processes (0: skip)",
    "rpc_per_client": "scenario 3: calls per client per concurrent run",
    "ingest_mib": "scenario 4: variant size",
    "ingest_runs": "scenario 4: runs",
    "site_mib": "scenario 9: comma-separated variant sizes from the site cache (largest: goal)",
    "site_runs": "scenario 9: runs per size",
    "revision_mib": "scenario 5: size of each of the five revisions",
    "trees": "scenario 6: comma-separated index sizes",
    "index_runs": "scenario 6: Resolve rounds per size",
    "gc_runs": "scenario 6: GC dry-run and real runs per size (each ~10 s at 100,000 trees)",
    "resolve_calls": "scenario 6: Resolve calls per run",
    "layers_steps": "layer benchmark: timed iterations",
    "hosts": "scenario 7: comma-separated numbers of hosts cold-starting at once",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes (see QUICK)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios to run")
    parser.add_argument("--out", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--ab",
        metavar="COMMIT",
        default=None,
        help="scenario 1: also run COMMIT's client in the same rounds; report paired differences",
    )
    for key, value in FULL.items():
        kind = type(value) if not isinstance(value, str) else str
        parser.add_argument(
            "--" + key.replace("_", "-"), type=kind, default=None, help=f"{HELP[key]} ({value})"
        )
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    args.overrides = []
    for key, value in profile.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
        else:
            args.overrides.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    args.ranks = sorted(int(x) for x in str(args.ranks).split(","))
    args.trees = sorted(int(x) for x in str(args.trees).split(","))
    args.hosts = sorted(int(x) for x in str(args.hosts).split(","))
    args.site_mib = sorted(int(x) for x in str(args.site_mib).split(","))
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {SCENARIOS}")
    args.argv = argv
    return args


def layers(ctx: Ctx) -> Section:
    """The layer benchmark, run as its own process; its table is embedded."""
    out = ctx.work / "layers.md"
    cmd = [
        sys.executable,
        "bench/layers_bench.py",
        "--steps",
        str(ctx.args.layers_steps),
        "--out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=900)
    text = out.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("Model:"))
    end = next((i for i, line in enumerate(text) if line.startswith("## Reading")), len(text))
    sec = Section("layers", "Extra: kernelized vs PyTorch layers in a small transformer")
    sec.settings = f"{ctx.args.layers_steps} timed iterations"
    sec.lines = [
        "From `bench/layers_bench.py` (not one of the issue's scenarios; folded in from the "
        "layers issue). A sanity figure: the example kernels are small C++ loops and pure-PyTorch "
        "noarch layers, so the point is that kernelizing costs nothing measurable.",
        "",
        *text[start:end],
    ]
    while sec.lines and not sec.lines[-1].strip():
        sec.lines.pop()
    return sec


def run_all(args: argparse.Namespace) -> tuple[list[Section], float]:
    from bench import (
        s1_warm,
        s2_cold,
        s3_rpc,
        s4_ingest,
        s6_index,
        s7_hosts,
        s8_endpoint,
        s9_site_ingest,
    )

    steps: list[tuple[str, Callable[[Ctx], Section]]] = [
        ("s1", s1_warm.run),
        ("s2", s2_cold.run),
        ("s3", s3_rpc.run),
        ("s4", s4_ingest.run_ingest),
        ("s6", s6_index.run),
        ("s7", s7_hosts.run),
        ("s8", s8_endpoint.run),
        ("s9", s9_site_ingest.run),
        ("s5", s4_ingest.run_footprint),  # last: it reports figures of s1, s3 and s6 too
        ("layers", layers),
    ]
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kerneld-bench-"))
    (work / "home").mkdir()
    sections: list[Section] = []
    try:
        t0 = time.perf_counter()
        built = build_examples()
        hub_root = make_bench_hub(work / "hub", built)
        log(f"example kernels and Hub repos ready in {time.perf_counter() - t0:.1f} s")
        with HubServer(hub_root, trusted_orgs={ORG: True}) as server:
            zygote = Zygote(work / "zygote.log", base_env(work / "home"))
            ctx = Ctx(args, work, built, hub_root, server, zygote)
            try:
                for key, fn in steps:
                    if key not in args.only:
                        continue
                    log(f"--- scenario {key}")
                    t = time.monotonic()
                    sec = fn(ctx)
                    sec.seconds = time.monotonic() - t
                    sections.append(sec)
                    log(f"--- scenario {key} took {sec.seconds:.0f} s")
            finally:
                zygote.close()
            if server.errors:
                raise RuntimeError(f"the Hub server hit errors: {server.errors[:3]}")
    finally:
        if args.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return sections, time.monotonic() - started


def command(args: argparse.Namespace) -> str:
    if not args.argv:
        return "`make bench` (= `.venv/bin/python -m bench.run`)"
    return f"`.venv/bin/python -m bench.run {shlex.join(args.argv)}`"


def render(
    args: argparse.Namespace,
    sections: list[Section],
    seconds: float,
    load: tuple[float, float],
) -> str:
    order = {k: i for i, k in enumerate(SCENARIOS)}
    sections = sorted(sections, key=lambda s: order[s.key])
    facts = machine_facts()
    vers = versions()
    profile = "quick (smoke test, scaled down)" if args.quick else "full"
    lines = [
        "# kerneld benchmarks",
        "",
        f"Generated by {command(args)} in {seconds / 60:.1f} minutes on {facts['date']}; "
        f"profile: **{profile}**"
        + (f", overridden: {', '.join(args.overrides)}" if args.overrides else "")
        + ". Benchmarks are not tests: nothing here passes or fails the test suite; the goals "
        "below are the issue's, for the report.",
        "",
        "## Machine",
        "",
        *table(
            ["", ""],
            [
                ("CPU", f"{facts['cores']} cores, {facts['cpu']}"),
                ("RAM", facts["ram"]),
                ("kernel", facts["kernel"]),
                ("load average (1 min) at start / end", f"{load[0]:.1f} / {load[1]:.1f}"),
                ("versions", ", ".join(f"{k} {v}" for k, v in vers.items())),
            ],
        ),
        "",
        "## Goals",
        "",
        *table(
            ["scenario", "goal", "met", "why"],
            [
                (
                    s.title.split(".")[0] if s.title[0].isdigit() else s.key,
                    g.text,
                    {True: "**met**", False: "**not met**", None: "n/a"}[g.met],
                    g.reason,
                )
                for s in sections
                for g in s.goals
            ],
        ),
        "",
        "## Time per scenario",
        "",
        *table(
            ["scenario", "settings", "seconds"],
            [(s.title, s.settings, f"{s.seconds:.0f}") for s in sections]
            + [("total (with the example build and the Hub repos)", "", f"{seconds:.0f}")],
        ),
    ]
    lines += ["", "## How this run differs from the issue's scenarios", ""]
    if args.quick or args.overrides:
        lines += [
            "- **Scaled down** (`--quick` or overrides): the issue's sizes are the full profile "
            "(N = 1, 8, 32, 64 with 5 runs; a 1 GiB ingest; 100 to 100,000 trees). These "
            "figures show that the pipeline works, not how fast kerneld is.",
        ]
    lines += [
        "- Ranks and single-process loads are fresh processes forked from a zygote that "
        "imported torch once (so 64 ranks do not spend minutes importing torch on 2 cores); "
        "each job's loader is imported once in a job zygote with the job's environment, and "
        "the ranks are forked from it. Import costs are measured separately (scenarios 1, 5).",
        "- The third cold-start kernel is `bench-noarch`, a pure-PyTorch noarch kernel the "
        "bench writes into the local Hub (the examples have two kernels).",
        "- The rate-limited cold start runs once per loader (each run lasts until its "
        "deadline), with a window of seconds instead of the Hub's 5 minutes.",
        "- Scenario 5's sizes are deterministic: one run. Scenario 6 runs "
        f"{args.gc_runs} GC(s) of each kind per size (one takes ~10 s or more at 100,000 "
        f"trees on 2 cores) and {args.index_runs} Resolve rounds.",
        "- Scenario 4 and 5 use the machine's disk for stores and caches (kerneld fsyncs, "
        "huggingface_hub does not); `sync` runs before each timed step.",
    ]
    for sec in sections:
        lines += ["", f"## {sec.title}", "", *sec.lines]
        for png in sec.plots:
            lines += ["", f"![{png}]({png})"]
    skipped = [k for k in SCENARIOS if k not in args.only]
    if skipped:
        lines += ["", f"Not run this time (`--only`): {', '.join(skipped)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:] or shlex.split(os.environ.get("BENCH_ARGS", ""))
    args = parse_args(argv)
    load0 = os.getloadavg()[0]
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)  # before the run: a bad --out fails at once
    log(f"profile {'quick' if args.quick else 'full'}; scenarios {', '.join(args.only)}")
    sections, seconds = run_all(args)
    from bench import s2_cold, s6_index, s7_hosts

    for sec in sections:
        if sec.key == "s2":
            sec.plots = s2_cold.plot(sec, out_dir)
        elif sec.key == "s6":
            sec.plots = s6_index.plot(sec, out_dir)
        elif sec.key == "s7":
            sec.plots = s7_hosts.plot(sec, out_dir)
    text = render(args, sections, seconds, (load0, os.getloadavg()[0]))
    args.out.write_text(text + kept_sections(args.out), encoding="utf-8")
    log(f"wrote {args.out} ({seconds:.0f} s)")
    for sec in sections:
        for g in sec.goals:
            print(
                f"  {sec.key}: {'met' if g.met else 'NOT met' if g.met is False else 'n/a'}: "
                f"{g.text} -- {g.reason}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
