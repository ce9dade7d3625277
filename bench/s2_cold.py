"""Scenario 2: cold start of N ranks at once, and the same under a Hub rate limit.

N ranks are forked together from a job zygote that has imported torch and the loader with the
job's environment (so 64 imports of `kernels` do not swamp 2 cores; imports are outside the
figure anyway). Each rank waits at a barrier, then loads the same three kernels
(`activation` and `relu2` v1, compiled; `bench-noarch` v1, pure PyTorch). *wall* = from the
release until the last rank has all three. The local Hub server counts the requests and body
bytes it served meanwhile. Per round, on fresh caches, one after the other:

- `kernels`, one HF cache per rank (each rank points huggingface_hub's cache constants and its
  environment at its own directory after the fork; the request counts confirm the caches are
  separate);
- `kernels`, one shared HF cache; then `kernels` warm on that same cache (online);
- kerneld: one fresh daemon with an empty store; then kerneld warm on the same daemon.

The rate-limited variant serves at most `--budget` requests per `--budget-window` seconds (then
429 with Retry-After, as the real Hub does), with N = `--budget-ranks`, one run per loader, and
reports who finished, who failed and when; ranks still loading at `--budget-deadline` are
stopped.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import fmt_count, fmt_stat, kernels_env, log, median, mib, ratios, table
from bench.hubrepos import COLD_KERNELS
from bench.scenario import DAEMON_CONFIG, Ctx, Goal, Section
from bench.zygote import JobResult
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess

REPOS = [f"{ORG}/{name}" for name in COLD_KERNELS]

KERNELS_SETUP = """
import os
import kernels
def load(repo):
    return kernels.get_kernel(repo, version=1)
"""
# After the fork: this rank's own HF cache (huggingface_hub reads these constants per call).
OWN_CACHE = """
import huggingface_hub.constants as _hc
_hc.HF_HOME = os.environ["HF_HOME"]
_hc.HF_HUB_CACHE = os.environ["HF_HUB_CACHE"]
"""
KERNELD_SETUP = """
import kerneld_client
get_kernel = kerneld_client.get_kernel  # the package is lazy: this imports the warm path
def load(repo):
    return get_kernel(repo, version=1, policy="error")
"""
KERNELD_EXTRA = "sorted({k.source for k in kerneld_client.loaded_kernels()})"

K_OWN = "kernels cold, HF cache per rank"
K_SHARED = "kernels cold, shared HF cache"
K_WARM = "kernels warm (online, shared HF cache)"
KD_COLD = "kerneld cold (one daemon, empty store)"
KD_WARM = "kerneld warm (same daemon)"
LOADERS = (K_OWN, K_SHARED, K_WARM, KD_COLD, KD_WARM)


@dataclass
class Series:
    jobs: list[JobResult] = field(default_factory=list)

    def walls(self) -> list[float]:
        return [j.wall_s for j in self.jobs]

    def per_rank(self) -> list[float]:
        return [median(j.durations) for j in self.jobs]

    def requests(self) -> list[float]:
        return [float(j.hub_requests) for j in self.jobs]

    def bytes(self) -> list[float]:
        return [float(j.hub_bytes) for j in self.jobs]


def kerneld_env(ctx: Ctx, work: Path, daemon: DaemonProcess) -> dict[str, str]:
    env = ctx.base_env()
    env["KERNELD_SOCKET"] = str(daemon.user_socket)
    env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
    return env


def own_cache_job(ctx: Ctx, work: Path, n: int, **kw: Any) -> JobResult:
    base = ctx.base_env()
    homes = [work / f"hf-{i}" for i in range(n)]
    rank_envs = [{"HF_HOME": str(h), "HF_HUB_CACHE": str(h / "hub")} for h in homes]
    result = ctx.zygote.job(
        env=kernels_env(base, ctx.server.url, work / "hf-unused"),
        setup=KERNELS_SETUP,
        rank_setup=OWN_CACHE,
        rank_envs=rank_envs,
        repos=REPOS,
        n=n,
        server=ctx.server,
        **kw,
    )
    if (work / "hf-unused" / "hub").exists():
        raise RuntimeError("a rank used the job's HF cache instead of its own")
    return result


def shared_cache_job(ctx: Ctx, work: Path, n: int, **kw: Any) -> JobResult:
    env = kernels_env(ctx.base_env(), ctx.server.url, work / "hf-shared")
    return ctx.zygote.job(
        env=env,
        setup=KERNELS_SETUP,
        repos=REPOS,
        n=n,
        server=ctx.server,
        **kw,
    )


def kerneld_job(ctx: Ctx, work: Path, daemon: DaemonProcess, n: int, **kw: Any) -> JobResult:
    return ctx.zygote.job(
        env=kerneld_env(ctx, work, daemon),
        setup=KERNELD_SETUP,
        repos=REPOS,
        n=n,
        extra=KERNELD_EXTRA,
        server=ctx.server,
        **kw,
    )


def one_round(ctx: Ctx, work: Path, n: int) -> dict[str, JobResult]:
    out: dict[str, JobResult] = {}
    out[K_OWN] = own_cache_job(ctx, work / "k-own", n)
    out[K_SHARED] = shared_cache_job(ctx, work / "k-shared", n)
    out[K_WARM] = shared_cache_job(ctx, work / "k-shared", n)
    with DaemonProcess(
        work / "daemon", hub_endpoint=ctx.server.url, config=DAEMON_CONFIG
    ) as daemon:
        out[KD_COLD] = kerneld_job(ctx, work / "kd", daemon, n)
        out[KD_WARM] = kerneld_job(ctx, work / "kd", daemon, n)
    sources = {s for r in out[KD_WARM].ranks for s in r.extra}
    if sources != {"index"}:
        raise RuntimeError(f"kerneld warm ranks did not load from the index: {sources}")
    return out


# --- rate limit ---------------------------------------------------------------------------------


@dataclass
class BudgetRun:
    loader: str
    job: JobResult

    def finished(self) -> list[float]:
        return sorted(r.end - self.job.go for r in self.job.ranks if r.ok and r.end is not None)

    def failed(self) -> list[str]:
        return [r.error or "?" for r in self.job.ranks if not r.ok]


def budget_runs(ctx: Ctx, work: Path) -> list[BudgetRun]:
    a = ctx.args
    n = a.budget_ranks

    def arm() -> None:
        ctx.server.set_rate_budget(a.budget, a.budget_window)

    kw: dict[str, Any] = {"tolerate": True, "deadline_s": a.budget_deadline, "before_go": arm}
    runs: list[BudgetRun] = []
    jobs: list[tuple[str, Callable[[], JobResult]]] = [
        (K_OWN, lambda: own_cache_job(ctx, work / "k-own", n, **kw)),
        (K_SHARED, lambda: shared_cache_job(ctx, work / "k-shared", n, **kw)),
    ]
    try:
        for name, fn in jobs:
            runs.append(BudgetRun(name, fn()))
            ctx.server.set_rate_budget(None)
            log(f"rate limit, {name}: {len(runs[-1].finished())}/{n} finished")
        with DaemonProcess(
            work / "daemon", hub_endpoint=ctx.server.url, config=DAEMON_CONFIG
        ) as daemon:
            runs.append(BudgetRun(KD_COLD, kerneld_job(ctx, work / "kd", daemon, n, **kw)))
            log(f"rate limit, {KD_COLD}: {len(runs[-1].finished())}/{n} finished")
    finally:
        ctx.server.set_rate_budget(None)
    return runs


# --- the scenario -------------------------------------------------------------------------------


def run(ctx: Ctx) -> Section:
    a = ctx.args
    ranks: list[int] = a.ranks
    table_: dict[tuple[str, int], Series] = {(ld, n): Series() for ld in LOADERS for n in ranks}
    for n in ranks:
        for r in range(a.runs):
            work = ctx.work / f"s2-n{n}-r{r}"
            t0 = time.monotonic()
            samples = one_round(ctx, work, n)
            for name, job in samples.items():
                table_[name, n].jobs.append(job)
            shutil.rmtree(work, ignore_errors=True)
            log(
                f"N={n} run {r + 1}/{a.runs} ({time.monotonic() - t0:.0f} s): "
                + ", ".join(
                    f"{k.split(' (')[0]} {j.wall_s:.2f}s/{j.hub_requests}req"
                    for k, j in samples.items()
                )
            )
    budget: list[BudgetRun] = []
    if a.budget_ranks > 0:
        budget = budget_runs(ctx, ctx.work / "s2-budget")
        shutil.rmtree(ctx.work / "s2-budget", ignore_errors=True)
    return report(ctx, table_, ranks, budget)


def report(
    ctx: Ctx, t: dict[tuple[str, int], Series], ranks: list[int], budget: list[BudgetRun]
) -> Section:
    a = ctx.args
    sec = Section("s2", "2. Cold start of N ranks at once")
    sec.settings = (
        f"N = {', '.join(map(str, ranks))}; {a.runs} run(s) per N; "
        f"rate limit: N = {a.budget_ranks}, {a.budget} requests per {a.budget_window:g} s, "
        f"deadline {a.budget_deadline:g} s"
    )
    lines = [
        "N ranks are forked together from a job zygote that imported torch and the loader with "
        "the job's environment; they wait at a barrier, then each loads the same three kernels: "
        f"`{ORG}/activation` v1 and `{ORG}/relu2` v1 (compiled C++; activation's library is an "
        f"LFS file) and `{ORG}/{COLD_KERNELS[2]}` v1 (a pure-PyTorch noarch kernel the bench "
        "writes: the examples have only two kernels). *wall* = from the release until the last "
        "rank has all three (imports are outside the figure: see scenario 1). *Hub requests* "
        "and *MiB served* = what the local Hub server counted meanwhile (requests without "
        "`kernels`' one telemetry probe per process; body bytes). For per-rank HF caches each "
        "rank points huggingface_hub's cache constants at its own directory after the fork. "
        f"Each cell: median (min-max) of {a.runs} run(s); in every run the five loaders go one "
        "after the other on fresh caches and ratios are taken pair by pair within the run.",
        "",
        *table(
            [
                "N",
                "loader",
                "wall s",
                "per-rank load s (median of ranks)",
                "Hub requests",
                "MiB served",
            ],
            [
                (
                    n,
                    name,
                    fmt_stat(t[name, n].walls()),
                    fmt_stat(t[name, n].per_rank()),
                    fmt_count(t[name, n].requests()),
                    fmt_stat([b / (1 << 20) for b in t[name, n].bytes()], 2),
                )
                for n in ranks
                for name in LOADERS
            ],
        ),
        "",
        "Ratios (wall, paired within each run; the last column is a ratio of medians):",
        "",
    ]
    base = median(t[KD_COLD, ranks[0]].walls())
    lines += table(
        [
            "N",
            "kernels per-rank caches / kerneld cold",
            "kernels shared cache / kerneld cold",
            "kernels warm / kerneld warm",
            f"kerneld cold at N / at N={ranks[0]}",
        ],
        [
            (
                n,
                fmt_stat(ratios(t[K_OWN, n].walls(), t[KD_COLD, n].walls()), 1, "x"),
                fmt_stat(ratios(t[K_SHARED, n].walls(), t[KD_COLD, n].walls()), 1, "x"),
                fmt_stat(ratios(t[K_WARM, n].walls(), t[KD_WARM, n].walls()), 1, "x"),
                f"{median(t[KD_COLD, n].walls()) / base:.2f}x",
            )
            for n in ranks
        ],
    )
    kinds_rows = []
    for name in LOADERS:
        for n in sorted({ranks[0], ranks[-1]}):
            kinds = t[name, n].jobs[0].hub_kinds
            text = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()) if v)
            kinds_rows.append((name, n, text or "none"))
    lines += [
        "",
        "Hub requests by kind (first run):",
        "",
        *table(["loader", "N", "requests"], kinds_rows),
    ]
    if budget:
        lines += [
            "",
            f"### Under a rate limit: {a.budget} requests per {a.budget_window:g} s window, "
            f"N = {a.budget_ranks}",
            "",
            "The server answers 429 with `Retry-After` (the seconds left in the window) once "
            "the window's budget is spent, as the Hub's rate limits do (theirs: per 5 minutes; "
            f"scaled down here). One run per loader; ranks still loading {a.budget_deadline:g} s "
            "after the release are stopped. Times are seconds after the release.",
            "",
            *table(
                [
                    "loader",
                    "ranks done",
                    "failed",
                    "stopped at deadline",
                    "first / median / last done s",
                    "requests answered / 429",
                    "MiB served",
                    "errors seen",
                ],
                [budget_row(b) for b in budget],
            ),
        ]
    sec.lines = lines
    sec.goals = goals(t, ranks, budget)
    sec.data = {"table": t, "ranks": ranks}
    return sec


def budget_row(b: BudgetRun) -> tuple[object, ...]:
    done = b.finished()
    failed = [e for e in b.failed() if e != "still loading at the deadline"]
    stopped = len(b.failed()) - len(failed)
    times = "-" if not done else f"{done[0]:.2f} / {median(done):.2f} / {done[-1]:.2f}"
    st = b.job.hub_statuses
    refused = st.get(429, 0)
    counts: dict[str, int] = {}
    for error in failed:
        short = re.sub(r"http://127\.0\.0\.1:\d+", "<hub>", error)[:110]
        counts[short] = counts.get(short, 0) + 1
    errors = [f"{n}x `{e}`" for e, n in sorted(counts.items())]
    return (
        b.loader,
        f"{len(done)}/{len(b.job.ranks)}",
        len(failed),
        stopped,
        times,
        f"{sum(st.values()) - refused} / {refused}",
        mib(b.job.hub_bytes),
        "; ".join(errors) or "-",
    )


def goals(
    t: dict[tuple[str, int], Series], ranks: list[int], budget: list[BudgetRun]
) -> list[Goal]:
    out = []
    reqs = sorted({int(x) for n in ranks for x in t[KD_COLD, n].requests()})
    byts = sorted({int(x) for n in ranks for x in t[KD_COLD, n].bytes()})
    out.append(
        Goal(
            "kerneld's Hub requests and bytes independent of N (one download per file per host)",
            len(reqs) == 1 and len(byts) == 1,
            f"{'/'.join(map(str, reqs))} requests and {'/'.join(mib(b) for b in byts)} MiB at "
            f"every N ({', '.join(map(str, ranks))})",
        )
    )
    top = ranks[-1]
    scale = median(t[KD_COLD, top].walls()) / median(t[KD_COLD, ranks[0]].walls())
    reason = (
        f"N={top}: {median(t[KD_COLD, top].walls()):.2f} s vs N={ranks[0]}: "
        f"{median(t[KD_COLD, ranks[0]].walls()):.2f} s = {scale:.2f}x"
    )
    if top < 64 or ranks[0] != 1:
        out.append(
            Goal(
                "kerneld cold wall at N=64 <= 1.5x its N=1 time",
                None,
                f"N=64 (or N=1) not run (scaled down); {reason}",
            )
        )
    else:
        out.append(Goal("kerneld cold wall at N=64 <= 1.5x its N=1 time", scale <= 1.5, reason))
    k_reqs = [median(t[K_OWN, n].requests()) for n in ranks]
    k_walls = [median(t[K_OWN, n].walls()) for n in ranks]
    grows = len(ranks) > 1 and k_reqs[-1] > k_reqs[0] and k_walls[-1] > k_walls[0]
    out.append(
        Goal(
            "`kernels` grows with N (context for the two goals above)",
            grows if len(ranks) > 1 else None,
            f"per-rank caches: {k_reqs[0]:g} -> {k_reqs[-1]:g} requests, {k_walls[0]:.2f} -> "
            f"{k_walls[-1]:.2f} s from N={ranks[0]} to N={top}",
        )
    )
    for b in budget:
        if b.loader == KD_COLD:
            done = b.finished()
            out.append(
                Goal(
                    "under the rate limit every kerneld rank finishes (report: who finishes)",
                    len(done) == len(b.job.ranks),
                    f"{len(done)}/{len(b.job.ranks)} ranks done"
                    + (f", the last at {done[-1]:.2f} s" if done else ""),
                )
            )
    return out


def plot(sec: Section, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t: dict[tuple[str, int], Series] = sec.data["table"]
    ranks: list[int] = sec.data["ranks"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=90)
    for name in LOADERS:
        series = [t[name, n] for n in ranks]
        med = [median(s.walls()) for s in series]
        lo = [m - min(s.walls()) for m, s in zip(med, series, strict=True)]
        hi = [max(s.walls()) - m for m, s in zip(med, series, strict=True)]
        ax.errorbar(ranks, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("ranks started at once (N)")
    ax.set_ylabel("wall time until all ranks loaded (s)")
    ax.set_title("cold start: 3 kernels per rank (median, min-max)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "cold_start_wall.png")
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0), dpi=90)
    for ax, key, label in (
        (axes[0], "requests", "Hub requests"),
        (axes[1], "bytes", "MiB served by the Hub"),
    ):
        for name in LOADERS:
            vals = [
                median(t[name, n].requests() if key == "requests" else t[name, n].bytes())
                for n in ranks
            ]
            if key == "bytes":
                vals = [v / (1 << 20) for v in vals]
            ax.plot(ranks, vals, "o-", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(n) for n in ranks])
        ax.set_yscale("symlog", linthresh=1.0 if key == "requests" else 0.01)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("ranks started at once (N)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "cold_start_hub_requests.png")
    plt.close(fig)
    return ["cold_start_wall.png", "cold_start_hub_requests.png"]
