"""One benchmark command: kerneld side by side with the `kernels` package (`make bench`).

Run from the repository root:

    .venv/bin/python -m bench.run [--ranks 1,4,16,32] [--runs 3] [--rtt-ms 0] [--full]

Headline: the cold start of N ranks at once. N fresh processes (forked from one zygote that has
imported torch and nothing else, so 32 torch imports do not swamp a 2-core machine) each set
their own environment, import their loader, wait at a barrier, then load the same kernels
(`kerneld-examples` `activation` and `relu2`, v1). The figure is the wall time from releasing
the barrier until the last rank has all its kernels, and the Hub requests the local
Hub-compatible test server (`tests/support/hubserver.py`, 127.0.0.1) counted meanwhile. Five
loaders, same server, same run:

- `kernels` cold, one HF cache per rank (empty): every rank downloads for itself;
- `kernels` cold, one shared HF cache (empty);
- `kernels` warm (the shared HF cache already filled; online, so refs are still asked);
- kerneld cold: one real daemon per run with an empty store (`tests/support/daemon.py`);
- kerneld warm: the same daemon after the cold run (ranks load over its published index).

The per-issue benchmarks (store, daemon, client, layers) are summarised from their committed
results in `bench/results/`; `--full` reruns them first (the store one ingests 1 GiB and the
daemon one builds 10,000 trees: several minutes). Writes `bench/RESULTS.md` and PNG plots.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))

from examples.kernels.build import ORG, build_examples, make_hub  # noqa: E402
from tests.support.daemon import DaemonProcess  # noqa: E402
from tests.support.hubserver import HubServer  # noqa: E402

KERNEL_NAMES = ("activation", "relu2")
LARGE_N = 16  # from here on a round costs tens of seconds on 2 cores
DAEMON_CONFIG = {"server": {"threads": 16}, "log": {"level": "info"}}  # the production threads

# The zygote: one process imports torch once (it costs the same for everybody and would dominate
# a 2-core machine), then, for each job read from stdin, forks one child per rank. Each child
# takes its own environment, then imports its loader (nothing of a loader is ever imported in
# the zygote), says it is ready and waits; the zygote prints "ready" when all are, releases them
# together on the next stdin line and prints their results as one JSON line.
ZYGOTE = """
import json, os, sys, time, traceback
import torch

def rank(job, env, ready_w, go_r, res_w):
    try:
        os.environ.clear()
        os.environ.update(env)
        g = {"__name__": "rank"}
        exec(job["setup"], g)
        os.write(ready_w, b"r")
        os.read(go_r, 1)
        t0 = time.time()
        mods = [g["load"](repo) for repo in job["repos"]]
        t1 = time.time()
        assert all(hasattr(m, "__file__") for m in mods)
        out = {"start": t0, "end": t1, "extra": eval(job["extra"], g)}
    except BaseException:
        out = {"error": traceback.format_exc()[-3000:]}
        os.write(ready_w, b"e")
    os.write(res_w, (json.dumps(out) + "\\n").encode())

def run(job):
    n = len(job["envs"])
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pids = []
    for env in job["envs"]:
        pid = os.fork()
        if pid == 0:
            rank(job, env, ready_w, go_r, res_w)
            os._exit(0)
        pids.append(pid)
    got = b""
    while len(got) < n:
        got += os.read(ready_r, n - len(got))
    print("ready" if b"e" not in got else "failed", flush=True)
    sys.stdin.readline()
    os.write(go_w, b"g" * n)
    buf = b""
    while buf.count(b"\\n") < n:
        buf += os.read(res_r, 65536)
    for pid in pids:
        os.waitpid(pid, 0)
    for fd in (ready_r, ready_w, go_r, go_w, res_r, res_w):
        os.close(fd)
    print(json.dumps([json.loads(line) for line in buf.decode().splitlines()]), flush=True)

print("up", flush=True)
for line in sys.stdin:
    run(json.loads(line))
"""

KERNELS_SETUP = """
import kernels
def load(repo):
    return kernels.get_kernel(repo, version=1)
"""
KERNELD_SETUP = """
import kerneld_client
get_kernel = kerneld_client.get_kernel  # lazy package: this imports the warm path
def load(repo):
    return get_kernel(repo, version=1, policy="error")
"""
KERNELD_EXTRA = "sorted({k.source for k in kerneld_client.loaded_kernels()})"

PER_ISSUE = [  # (file, what, command when rerun by --full)
    ("store", "ingest throughput vs hashlib, dedupe of 5 revisions", ["bench/store_bench.py"]),
    (
        "daemon",
        "Resolve RPC vs a bare grpcio echo, RSS with 10,000 trees",
        ["bench/daemon_bench.py"],
    ),
    (
        "client",
        "warm load in a fresh process: kerneld vs floor vs kernels",
        ["bench/client_bench.py"],
    ),
    ("layers", "kernelized vs PyTorch layers in a small transformer", ["bench/layers_bench.py"]),
]


@dataclass
class Sample:
    """One start of N ranks: wall time (barrier -> last rank done) and Hub requests."""

    wall_s: float
    rank_s: list[float]
    hub_requests: int
    hub_kinds: dict[str, int]
    extra: list[Any] = field(default_factory=list)


@dataclass
class Series:
    loader: str
    ranks: int
    samples: list[Sample] = field(default_factory=list)

    def walls(self) -> list[float]:
        return [s.wall_s for s in self.samples]

    def requests(self) -> list[int]:
        return [s.hub_requests for s in self.samples]


# --- running ranks --------------------------------------------------------------------------


def base_env(home: Path) -> dict[str, str]:
    drop = ("KERNELD_", "HF_", "LOCAL_KERNELS", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")})
    return env


class Zygote:
    """The ZYGOTE process; `ranks()` runs one job: N ranks released together."""

    def __init__(self, work: Path, server: HubServer) -> None:
        self.server = server
        self.stderr = open(work / "zygote.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            cwd=ROOT,
            env=base_env(work / "home"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        if self.readline() != "up":
            raise RuntimeError("the zygote did not start; see zygote.log")

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def ranks(self, setup: str, envs: list[dict[str, str]], extra: str = "None") -> Sample:
        repos = [f"{ORG}/{name}" for name in KERNEL_NAMES]
        job = {"envs": envs, "setup": textwrap.dedent(setup), "extra": extra, "repos": repos}
        self.send(json.dumps(job))
        ready = self.readline()
        self.server.reset_counts()
        go = time.time()
        self.send("go")
        line = self.readline()
        if not line:
            raise RuntimeError(f"the zygote died (rc {self.proc.wait()}); see zygote.log")
        results = json.loads(line)
        errors = [r["error"] for r in results if "error" in r]
        if ready != "ready" or errors:
            raise RuntimeError(f"{len(errors)} rank(s) failed; the first:\n{errors[:1]}")
        return Sample(
            wall_s=max(r["end"] for r in results) - go,
            rank_s=[r["end"] - r["start"] for r in results],
            hub_requests=self.server.total(),
            hub_kinds=dict(self.server.counts),
            extra=[r["extra"] for r in results],
        )

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


# --- the scenarios (one function each; every one returns one Sample) --------------------------


def kernels_env(base: dict[str, str], server: HubServer, hf_home: Path) -> dict[str, str]:
    return {
        **base,
        "HF_ENDPOINT": server.url,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
    }


def kernels_cold_own_cache(z: Zygote, work: Path, n: int) -> Sample:
    base = base_env(work / "home")
    envs = [kernels_env(base, z.server, work / f"hf-{i}") for i in range(n)]
    return z.ranks(KERNELS_SETUP, envs)


def kernels_cold_shared_cache(z: Zygote, work: Path, n: int) -> Sample:
    env = kernels_env(base_env(work / "home"), z.server, work / "hf-shared")
    return z.ranks(KERNELS_SETUP, [env] * n)


def kernels_warm(z: Zygote, work: Path, n: int) -> Sample:
    """The same shared HF cache, already filled by kernels_cold_shared_cache."""
    return kernels_cold_shared_cache(z, work, n)


def kerneld_env(work: Path, daemon: DaemonProcess) -> dict[str, str]:
    env = base_env(work / "home")
    env["KERNELD_SOCKET"] = str(daemon.user_socket)
    env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
    return env


def kerneld_cold(z: Zygote, work: Path, daemon: DaemonProcess, n: int) -> Sample:
    """`daemon` has an empty store."""
    return z.ranks(KERNELD_SETUP, [kerneld_env(work, daemon)] * n, KERNELD_EXTRA)


def kerneld_warm(z: Zygote, work: Path, daemon: DaemonProcess, n: int) -> Sample:
    """The same daemon after kerneld_cold."""
    return z.ranks(KERNELD_SETUP, [kerneld_env(work, daemon)] * n, KERNELD_EXTRA)


COLD_K_OWN = "kernels cold, HF cache per rank"
COLD_K_SHARED = "kernels cold, shared HF cache"
WARM_K = "kernels warm (online, shared HF cache)"
COLD_KD = "kerneld cold (one daemon, empty store)"
WARM_KD = "kerneld warm (same daemon)"
LOADERS = (COLD_K_OWN, COLD_K_SHARED, WARM_K, COLD_KD, WARM_KD)


def one_round(z: Zygote, work: Path, n: int) -> dict[str, Sample]:
    """Every loader once for N ranks, each on fresh caches (warm ones filled by the cold ones)."""
    out: dict[str, Sample] = {}
    out[COLD_K_OWN] = kernels_cold_own_cache(z, work / "k-own", n)
    out[COLD_K_SHARED] = kernels_cold_shared_cache(z, work / "k-shared", n)
    out[WARM_K] = kernels_warm(z, work / "k-shared", n)
    with DaemonProcess(work / "daemon", hub_endpoint=z.server.url, config=DAEMON_CONFIG) as d:
        out[COLD_KD] = kerneld_cold(z, work / "kd", d, n)
        out[WARM_KD] = kerneld_warm(z, work / "kd", d, n)
    return out


def runs_for(n: int, args: argparse.Namespace) -> int:
    return int(args.runs if n < LARGE_N else args.large_runs)


def multi_rank(
    work: Path,
    z: Zygote,
    ranks: list[int],
    args: argparse.Namespace,
    log: Callable[[str], None],
) -> dict[tuple[str, int], Series]:
    table = {(name, n): Series(name, n) for name in LOADERS for n in ranks}
    for n in ranks:
        runs = runs_for(n, args)
        for run in range(runs):
            round_dir = work / f"n{n}-r{run}"
            samples = one_round(z, round_dir, n)
            for name, sample in samples.items():
                table[name, n].samples.append(sample)
            log(
                f"N={n} run {run + 1}/{runs}: "
                + ", ".join(
                    f"{k.split(' (')[0]} {s.wall_s:.2f}s/{s.hub_requests}req"
                    for k, s in samples.items()
                )
            )
            shutil.rmtree(round_dir, ignore_errors=True)
    return table


# --- report -----------------------------------------------------------------------------------


def fmt_med(values: list[float], unit: str = "", digits: int = 2) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}{unit}"
    return f"{med:.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def fmt_count(values: list[int]) -> str:
    med = statistics.median(values)
    text = f"{med:g}"
    return text if min(values) == max(values) else f"{text} ({min(values)}-{max(values)})"


def paired_ratio(a: Series, b: Series) -> str:
    """Median of a/b over the runs, each pair from the same round."""
    ratios = [x / y for x, y in zip(a.walls(), b.walls(), strict=True)]
    return fmt_med(ratios, "x", 1)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for dist in ("torch", "kernels", "huggingface_hub", "grpcio", "kerneld"):
        try:
            out[dist] = version(dist)
        except Exception:  # a missing package is reported, not fatal
            out[dist] = "not installed"
    return out


START_LOAD = os.getloadavg()[0]


def machine() -> str:
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()} "
        f"{platform.release()}; 1-minute load average {START_LOAD:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end (the ranks themselves load the machine)"
    )


def plot(table: dict[tuple[str, int], Series], ranks: list[int]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for key, ylabel, fname in (
        ("wall", "wall time until all ranks loaded (s)", "cold_start_wall.png"),
        ("req", "Hub requests", "cold_start_hub_requests.png"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=90)
        for name in LOADERS:
            series = [table[name, n] for n in ranks]
            if key == "wall":
                med = [statistics.median(s.walls()) for s in series]
                lo = [m - min(s.walls()) for m, s in zip(med, series, strict=True)]
                hi = [max(s.walls()) - m for m, s in zip(med, series, strict=True)]
                ax.errorbar(ranks, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
            else:
                ax.plot(ranks, [statistics.median(s.requests()) for s in series], "o-", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(n) for n in ranks])
        ax.set_xlabel("ranks started at once (N)")
        ax.set_ylabel(ylabel)
        if key == "req":
            ax.set_yscale("symlog")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(BENCH / fname)
        plt.close(fig)
        names.append(fname)
    return names


def first_table(path: Path) -> list[str]:
    """The command line and the first markdown table of a committed per-issue result."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = [line for line in lines if line.startswith("Command:")][:1]
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return out
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return [*out, "", *lines[start:end]]


def report(
    table: dict[tuple[str, int], Series],
    ranks: list[int],
    args: argparse.Namespace,
    plots: list[str],
    seconds: float,
    arch_variant: str,
) -> str:
    vers = versions()
    lines = [
        "# kerneld benchmarks",
        "",
        f"Command: `make bench` (`python -m bench.run --ranks {args.ranks} --runs {args.runs} "
        f"--large-runs {args.large_runs} --rtt-ms {args.rtt_ms:g}"
        f"{' --full' if args.full else ''}`); the run took "
        f"{seconds:.0f} s on {datetime.date.today().isoformat()}.",
        "",
        f"Machine: {machine()}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in vers.items())
        + f". Kernels: `{ORG}/{{{','.join(KERNEL_NAMES)}}}` v1, variant `{arch_variant}`.",
        "",
        "## Headline: cold start of N ranks at once",
        "",
        "N processes are forked together from one zygote that has imported torch and nothing "
        "else; each sets its own environment, imports its loader, waits at a barrier, then "
        "loads both kernels. *wall* = from releasing the barrier until the last rank has both "
        "kernels (interpreter, torch and loader imports are left out: the client bench covers "
        "imports). *Hub requests* = requests the local Hub server counted meanwhile, "
        "without `kernels`' agent_harnesses probe (one per rank, listed below) "
        f"(127.0.0.1, injected latency {args.rtt_ms:g} ms per request). Each cell: median "
        f"(min-max) of {args.runs} run(s) for N < {LARGE_N}, {args.large_runs} for larger N; "
        "in every run all five loaders go one after the "
        "other on fresh caches, and ratios are taken pair by pair within a run.",
        "",
        "| N | loader | wall s | per-rank load s (median of ranks) | Hub requests |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n in ranks:
        for name in LOADERS:
            s = table[name, n]
            per_rank = [statistics.median(x.rank_s) for x in s.samples]
            lines.append(
                f"| {n} | {name} | {fmt_med(s.walls())} | {fmt_med(per_rank)} "
                f"| {fmt_count(s.requests())} |"
            )
    lines += [
        "",
        "### Ratios (same run, paired)",
        "",
        "| N | kernels cold per-rank cache / kerneld cold | kernels cold shared cache / "
        "kerneld cold | kernels warm / kerneld warm | kerneld cold N / kerneld cold N=1 |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = statistics.median(table[COLD_KD, ranks[0]].walls())
    for n in ranks:
        kd_scale = statistics.median(table[COLD_KD, n].walls()) / base
        lines.append(
            f"| {n} | {paired_ratio(table[COLD_K_OWN, n], table[COLD_KD, n])} "
            f"| {paired_ratio(table[COLD_K_SHARED, n], table[COLD_KD, n])} "
            f"| {paired_ratio(table[WARM_K, n], table[WARM_KD, n])} | {kd_scale:.2f}x |"
        )
    kinds_rows = []
    for name in LOADERS:
        for n in (ranks[0], ranks[-1]):
            kinds = table[name, n].samples[0].hub_kinds
            text = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()) if v)
            kinds_rows.append(f"| {name} | {n} | {text or 'none'} |")
    sources = sorted({src for s in table[WARM_KD, ranks[-1]].samples for e in s.extra for src in e})
    lines += [
        "",
        "### Hub requests by kind (first run)",
        "",
        "| loader | N | requests by kind |",
        "| --- | --- | --- |",
        *kinds_rows,
        "",
        f"kerneld warm ranks (N={ranks[-1]}) reported the source(s) {', '.join(sources)} "
        "(`index`: the published index answered, no RPC).",
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
        "## Per-issue benchmarks",
        "",
    ]
    if not args.full:
        lines += [
            "Summarised from the committed results (not rerun by default: the store bench "
            "ingests 1 GiB and the daemon bench builds 10,000 trees; `python -m bench.run "
            "--full` reruns all four first). Their dates are in each file.",
            "",
        ]
    for name, what, _ in PER_ISSUE:
        path = BENCH / "results" / f"{name}.md"
        lines += [f"### {name}: {what} ([results/{name}.md](results/{name}.md))", ""]
        lines += first_table(path) if path.exists() else ["(no committed result)"]
        lines.append("")
    lines += [
        "## Not measured here (issue 9)",
        "",
        "- the 50 ms RTT warm-load row and the 429-after-a-budget cold start;",
        "- bytes served by the Hub (the test server counts requests, not bytes);",
        "- Resolve latency and GC time at 100 / 10,000 / 100,000 trees (scenario 6);",
        "- N = 64 and >= 5 runs at every N: scaled down to fit a 2-core machine in a few "
        "minutes (`--ranks`, `--runs`, `--large-runs`);",
        "- `import kerneld_client` vs `import kernels` and the single-process warm rows are "
        "the client bench's (committed), not rerun by default.",
        "",
    ]
    return "\n".join(lines)


def rerun_per_issue(log: Callable[[str], None]) -> None:
    for name, _, cmd in PER_ISSUE:
        log(f"rerunning the {name} benchmark (--full)")
        out = ["--out", f"bench/results/{name}.md"]
        subprocess.run([sys.executable, *cmd, *out], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="1,4,16,32", help="comma-separated N")
    parser.add_argument("--runs", type=int, default=5, help=f"runs per N below {LARGE_N}")
    parser.add_argument("--large-runs", type=int, default=3, help=f"runs per N >= {LARGE_N}")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="Hub server latency per request")
    parser.add_argument("--full", action="store_true", help="rerun the per-issue benchmarks too")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    ranks = sorted(int(x) for x in args.ranks.split(","))
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

    if args.full:
        rerun_per_issue(log)
    work = Path(tempfile.mkdtemp(prefix="kerneld-bench-"))
    (work / "home").mkdir()
    try:
        built = build_examples()
        hub = make_hub(work / "hub", built=built)
        with HubServer(hub.root, trusted_orgs={ORG: True}, latency_s=args.rtt_ms / 1e3) as server:
            log(f"Hub test server up; ranks {ranks}")
            zygote = Zygote(work, server)
            try:
                table = multi_rank(work, zygote, ranks, args, log)
            finally:
                zygote.close()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    plots = plot(table, ranks)
    text = report(table, ranks, args, plots, time.monotonic() - started, built.arch_variant)
    (BENCH / "RESULTS.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
