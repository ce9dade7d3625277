"""Scenario 8: unmodified `kernels` through the daemon's Hub API, against the same `kernels`
straight to the Hub and against the start-up hook (issue 24).

One daemon (its store warm: the three bench kernels fetched once before the timed jobs) with
`[hub_api] listen` on loopback. N ranks are forked together from a job zygote that has imported
torch and `kernels` 0.17.2 (imports are outside the figure), each loads the three bench kernels
with `kernels.get_kernel(repo, version=1)`. Per N, one after the other, each `--runs` times:

- **Hub, warm HF cache**: `HF_ENDPOINT` = the Hub test server, the shared HF cache already
  holding the kernels (what a job start costs with plain `kernels` today, at 0 ms RTT);
- **endpoint, warm HF cache**: `HF_ENDPOINT` = the daemon, the same warm-cache situation;
- **endpoint, empty HF cache**: a fresh HF cache per job (a new container, a new node image):
  `kernels` downloads every file, from the daemon's store on loopback;
- **hook**: `KERNELD_HOOK_KERNELS=1` (the published index; no HTTP at all).

*per rank* = median over ranks of the time to load all three; *wall* = from the release until
the last rank has them. The Hub test server counts what reaches it.
"""

from __future__ import annotations

import re
import shutil
from typing import Any

from bench.common import fmt_count, fmt_stat, kernels_env, log, median, table
from bench.hubrepos import COLD_KERNELS
from bench.s2_cold import KERNELS_SETUP
from bench.scenario import DAEMON_CONFIG, Ctx, Goal, Section
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess

REPOS = [f"{ORG}/{name}" for name in COLD_KERNELS]
# The hook attaches when `kernels` is imported; the job zygote sets it up before that import
# (the .pth line that does it at interpreter start ran before the job's environment existed).
HOOK_SETUP = (
    """
from kerneld_client.integrations import kernels as _hook
assert _hook.install()
"""
    + KERNELS_SETUP
)
HUB = "kernels -> Hub, warm HF cache"
ENDPOINT = "kernels -> endpoint, warm HF cache"
ENDPOINT_EMPTY = "kernels -> endpoint, empty HF cache"
HOOK = "kernels + hook (index)"
LOADERS = (HUB, ENDPOINT, ENDPOINT_EMPTY, HOOK)


def _endpoint(daemon: DaemonProcess) -> str:
    urls = re.findall(r"hub api on (http://[0-9.:]+)", daemon.wait_for_log("hub api on http://"))
    return str(urls[-1])


def run(ctx: Ctx) -> Section:
    work = ctx.work / "s8"
    config = {**DAEMON_CONFIG, "hub_api": {"listen": "127.0.0.1:0"}}
    daemon = DaemonProcess(work / "daemon", config=config, hub_endpoint=ctx.server.url).start()
    try:
        endpoint = _endpoint(daemon)
        base = ctx.base_env()
        hook_env = {**base, "KERNELD_SOCKET": str(daemon.user_socket)}
        hook_env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
        # Warm-up: the daemon's store, and one warm HF cache per HF_ENDPOINT.
        warm = {HUB: work / "hf-hub", ENDPOINT: work / "hf-endpoint"}
        for name, url in ((HUB, ctx.server.url), (ENDPOINT, endpoint)):
            ctx.zygote.job(env=kernels_env(base, url, warm[name]), setup=KERNELS_SETUP, repos=REPOS)
        ctx.zygote.job(
            env=kernels_env(hook_env, ctx.server.url, work / "hf-hook"),
            setup=HOOK_SETUP,
            repos=REPOS,
        )
        rows: dict[tuple[str, int], dict[str, list[float]]] = {}
        for n in ctx.args.ranks:
            for run_i in range(ctx.args.runs):
                for name in LOADERS:
                    if name == HOOK:
                        env = kernels_env(hook_env, ctx.server.url, work / "hf-hook")
                        setup = HOOK_SETUP
                    elif name == ENDPOINT_EMPTY:
                        fresh = work / f"hf-empty-{n}-{run_i}"
                        env, setup = kernels_env(base, endpoint, fresh), KERNELS_SETUP
                    else:
                        url = ctx.server.url if name == HUB else endpoint
                        env, setup = kernels_env(base, url, warm[name]), KERNELS_SETUP
                    result = ctx.zygote.job(
                        env=env, setup=setup, repos=REPOS, n=n, server=ctx.server
                    )
                    if name == ENDPOINT_EMPTY:
                        shutil.rmtree(work / f"hf-empty-{n}-{run_i}", ignore_errors=True)
                    row = rows.setdefault((name, n), {"rank": [], "wall": [], "hub": []})
                    row["rank"].append(median(result.durations))
                    row["wall"].append(result.wall_s)
                    row["hub"].append(float(result.hub_requests))
                    log(f"s8 N={n} {name}: {median(result.durations) * 1000:.1f} ms per rank")
    finally:
        daemon.close()
    return report(ctx, rows)


def report(ctx: Ctx, rows: dict[tuple[str, int], dict[str, list[float]]]) -> Section:
    sec = Section("s8", "8. `kernels` through the daemon's Hub API")
    ranks = list(ctx.args.ranks)
    sec.settings = f"N = {', '.join(map(str, ranks))}; {ctx.args.runs} run(s) per N and route"
    body: list[list[Any]] = []
    for n in ranks:
        hub_rank = median(rows[(HUB, n)]["rank"])
        for name in LOADERS:
            r = rows[(name, n)]
            body.append(
                [
                    n,
                    name,
                    fmt_stat([v * 1000 for v in r["rank"]], 1),
                    f"{median(r['rank']) / hub_rank:.2f}x",
                    fmt_stat(r["wall"], 2),
                    fmt_count(r["hub"]),
                ]
            )
    sec.lines = [
        "See `bench/s8_endpoint.py`. One daemon with a warm store; `kernels` 0.17.2 unmodified "
        "(hook off) except on the hook row. *vs Hub* = per-rank time over the same N's "
        "`kernels -> Hub` row.",
        "",
        *table(["N", "route", "per rank ms", "vs Hub", "wall s", "Hub requests per job"], body),
    ]
    top = ranks[-1]
    warm_hub = [median(rows[(ENDPOINT, n)]["hub"]) for n in ranks]
    sec.goals.append(
        Goal(
            "kernels through the endpoint, warm: 0 Hub requests at every N",
            all(v == 0 for v in warm_hub) and median(rows[(ENDPOINT_EMPTY, top)]["hub"]) == 0,
            f"endpoint rows: {', '.join(fmt_count(rows[(ENDPOINT, n)]['hub']) for n in ranks)} "
            f"(warm cache), {fmt_count(rows[(ENDPOINT_EMPTY, top)]['hub'])} (empty cache, "
            f"N = {top}); straight to the Hub: "
            f"{', '.join(fmt_count(rows[(HUB, n)]['hub']) for n in ranks)}",
        )
    )
    ratio = median(rows[(ENDPOINT, top)]["rank"]) / median(rows[(HUB, top)]["rank"])
    sec.goals.append(
        Goal(
            f"report: the endpoint's per-rank cost against the Hub test server's at N = {top}",
            None,
            f"{ratio:.2f}x ({median(rows[(ENDPOINT, top)]['rank']) * 1000:.1f} ms vs "
            f"{median(rows[(HUB, top)]['rank']) * 1000:.1f} ms; hook "
            f"{median(rows[(HOOK, top)]['rank']) * 1000:.1f} ms)",
        )
    )
    sec.data["rows"] = {f"{k[0]}|{k[1]}": v for k, v in rows.items()}
    return sec
