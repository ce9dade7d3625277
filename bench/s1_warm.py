"""Scenario 1: a warm load in one fresh process, side by side.

Every figure is a brand-new interpreter (`python -c`, as a training process starts: not a fork,
whose copy-on-write faults would slow the loader's Python several-fold), which imports torch
(not timed), then the loader (timed: *import*) and makes the one loading call (timed: *call*),
loading `kerneld-examples/activation` v1 (the compiled CPU
variant, a native library registering three ops):

1. kerneld warm: `get_kernel` over the daemon's published index and its pick for this platform (no
   RPC, no ranking; grpc never imported): the warm fast path (`kerneld_client._warm`, issue 56),
   also once more step by step (`s1_steps`);
2. kerneld RPC path: the same with KERNELD_REF_MAX_AGE=0, so the ref is a question for the
   daemon: grpc import, a channel on the unix socket, Resolve, then the same checks and import;
3. floor: `importlib` of a byte-identical copy of the same variant folder, bytecode cached;
4. `kernels.get_kernel` warm, online against the same local Hub server at 0 ms added latency,
5. and with a realistic 50 ms round trip added to every request (`--rtt-ms`);
6. `kernels.get_kernel` with HF_HUB_OFFLINE=1 (by commit: offline `version=` needs a full
   snapshot in kernels 0.17.2).

One warm-up process per loader first (fills bytecode caches); then every run takes each loader
once, so ratios are paired within a run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench import s1_ab, s1_fork, s1_merged, s1_steps
from bench.common import fmt_stat, kernels_env, log, median, ratios, table
from bench.scenario import DAEMON_CONFIG, Ctx, Goal, Section
from bench.zygote import JobResult, fresh_job
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess

REPO = f"{ORG}/activation"
RELU2 = f"{ORG}/relu2"

CHECK = """
def info():
    x = torch.randn(4, 16)
    ref = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
    torch.testing.assert_close(MOD.silu_and_mul_alloc(x), ref)
    return INFO()
"""

KERNELD = (
    """
import sys, time
import torch
_t0 = time.perf_counter()
import kerneld_client
_t1 = time.perf_counter()
get_kernel = kerneld_client.get_kernel  # the package is lazy: this imports the warm path
_t2 = time.perf_counter()
SETUP_EXTRA = {"pkg_ms": (_t1 - _t0) * 1e3, "import_ms": (_t2 - _t0) * 1e3}
def load(repo):
    global MOD
    MOD = get_kernel(repo, version=1, policy="error")
    return MOD
def INFO():
    staged = "kerneld_client.loading.pipeline" in sys.modules
    return {
        "staged": staged,
        "source": kerneld_client.loaded_kernels()[0].source,
        "grpc": "grpc" in sys.modules,
        "ranked": "kerneld_client.variants.choice" in sys.modules,
        "client": kerneld_client.__file__,
    }
"""
    + CHECK
)

FLOOR = (
    """
import importlib.util, sys
import torch
SETUP_EXTRA = {"import_ms": 0.0}
def load(repo):
    global MOD
    spec = importlib.util.spec_from_file_location(MODULE_ID, FOLDER + "/__init__.py")
    MOD = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = MOD
    spec.loader.exec_module(MOD)
    return MOD
def INFO():
    return {}
"""
    + CHECK
)

KERNELS = (
    """
import time
import torch
_t0 = time.perf_counter()
import kernels
SETUP_EXTRA = {"import_ms": (time.perf_counter() - _t0) * 1e3}
def load(repo):
    global MOD
    MOD = kernels.get_kernel(repo, SELECTOR)
    return MOD
def INFO():
    return {}
"""
    + CHECK
)

KD_WARM = "kerneld warm (published index, no RPC)"
KD_RPC = "kerneld RPC path (daemon hit)"
FLOOR_ROW = "floor: importlib of the variant folder"
K_ONLINE = "kernels.get_kernel warm, online, 0 ms RTT"
K_OFFLINE = "kernels.get_kernel, HF_HUB_OFFLINE=1"


def k_rtt(rtt_ms: float) -> str:
    return f"kernels.get_kernel warm, online, {rtt_ms:g} ms RTT"


def run(ctx: Ctx) -> Section:
    a = ctx.args
    work = ctx.work / "s1"
    server = ctx.server
    rows: dict[str, list[JobResult]] = {}
    with DaemonProcess(work / "daemon", hub_endpoint=server.url, config=DAEMON_CONFIG) as daemon:
        env = ctx.base_env()
        env["KERNELD_SOCKET"] = str(daemon.user_socket)
        env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
        kd = KERNELD
        cold = ctx.zygote.job(env=env, setup=kd, repos=[REPO], extra="info()")
        assert cold.ranks[0].extra["source"] == "daemon", cold.ranks[0].extra

        commit, module_id, floor_dir = floor_copy(
            daemon.store_root, REPO, ctx.built.arch_variant, work / "floor"
        )
        floor = FLOOR.replace("MODULE_ID", repr(module_id)).replace("FOLDER", repr(floor_dir))

        hf = kernels_env(ctx.base_env(), server.url, work / "hf-home")
        online = KERNELS.replace("SELECTOR", "version=1")
        ctx.zygote.job(env=hf, setup=online, repos=[REPO], extra="info()")  # fills the cache
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
        snapshot_download(
            REPO,
            repo_type="kernel",
            revision=commit,
            cache_dir=str(work / "hf-home" / "hub"),
            endpoint=server.url,
        )
        offline = KERNELS.replace("SELECTOR", f"revision={commit!r}")

        def latency(ms: float) -> None:
            server.latency_s = ms / 1e3

        loaders: list[tuple[str, dict[str, str], str, float]] = [
            (KD_WARM, env, kd, 0.0),
            (KD_RPC, {**env, "KERNELD_REF_MAX_AGE": "0"}, kd, 0.0),
            (FLOOR_ROW, env, floor, 0.0),
            (K_ONLINE, hf, online, 0.0),
            (k_rtt(a.rtt_ms), hf, online, a.rtt_ms),
            (K_OFFLINE, {**hf, "HF_HUB_OFFLINE": "1"}, offline, 0.0),
        ]
        ab: tuple[str, Path] | None = None
        if a.ab:
            ab = s1_ab.checkout_client(a.ab, work / "ab")
            old = s1_ab.env_with(env, ab[1])
            loaders += [
                (ab_row(KD_WARM, ab[0]), old, kd, 0.0),
                (ab_row(KD_RPC, ab[0]), {**old, "KERNELD_REF_MAX_AGE": "0"}, kd, 0.0),
            ]
        paths_first = {KD_WARM, KD_RPC, FLOOR_ROW} | (
            {ab_row(KD_WARM, ab[0]), ab_row(KD_RPC, ab[0])} if ab else set()
        )
        steps: list[JobResult] = []
        try:
            for run_i in range(-1, a.warm_runs):  # -1: warm-up processes
                job = fresh_job(
                    env=s1_steps.env_for(env),
                    setup=s1_steps.setup_code(CHECK),
                    repos=[REPO],
                    extra="info()",
                )
                if run_i >= 0:
                    steps.append(job)
                for name, e, code, rtt in loaders:
                    if run_i < 0 and name not in paths_first:
                        continue  # kernels' cache and bytecode were filled above
                    latency(rtt)
                    job = fresh_job(env=e, setup=code, repos=[REPO], extra="info()")
                    if run_i >= 0:
                        rows.setdefault(name, []).append(job)
                latency(0.0)
                if run_i >= 0:
                    log(
                        f"warm load run {run_i + 1}/{a.warm_runs}: "
                        + ", ".join(
                            f"{n.split(' (')[0].split(',')[0]} {call_ms(j[-1]):.1f}ms"
                            for n, j in rows.items()
                        )
                    )
            ctx.zygote.job(env=env, setup=kd, repos=[RELU2], extra="0")  # cold: into the store
            _, relu2_id, relu2_dir = floor_copy(
                daemon.store_root, RELU2, ctx.built.arch_variant, work / "floor-relu2"
            )
            floors = {REPO: (module_id, floor_dir), RELU2: (relu2_id, relu2_dir)}
            forks = s1_fork.measure(env, REPO, RELU2, a.warm_runs, floors)
            warm_modules = list(steps[0].ranks[0].extra["imports"])  # in import order
            merged = s1_merged.measure(env, warm_modules, a.warm_runs, work)
        finally:
            latency(0.0)
    shutil.rmtree(work, ignore_errors=True)
    check_paths(rows, ab)
    ctx.shared["imports"] = {
        "`import kerneld_client` (the package: lazy)": [
            j.setup_extra["pkg_ms"] for j in rows[KD_WARM]
        ],
        "`import kerneld_client` + its warm path (first `get_kernel` access)": [
            j.setup_extra["import_ms"] for j in rows[KD_WARM]
        ],
        "`import kernels`": [j.setup_extra["import_ms"] for j in rows[K_ONLINE]],
    }
    sec = report(ctx, {k: v for k, v in rows.items() if not ab or not k.endswith(f"@ {ab[0]}")})
    if ab:
        calls = {name: [call_ms(j) for j in jobs] for name, jobs in rows.items()}
        totals = {
            name: [call_ms(j) + float(j.setup_extra["import_ms"]) for j in jobs]
            for name, jobs in rows.items()
        }
        sec.lines += s1_ab.report(
            ab[0],
            calls,
            totals,
            [
                ("kerneld warm", KD_WARM, ab_row(KD_WARM, ab[0])),
                ("kerneld RPC path", KD_RPC, ab_row(KD_RPC, ab[0])),
            ],
        )
    sec.lines += s1_steps.report(steps, sec.data["calls"][KD_WARM])
    call_over_floor = median(
        [
            w - f
            for w, f in zip(sec.data["calls"][KD_WARM], sec.data["calls"][FLOOR_ROW], strict=True)
        ]
    )
    sec.lines += s1_merged.report(merged, len(warm_modules), call_over_floor)
    fork_lines, fork_goals = s1_fork.report(forks)
    sec.lines += fork_lines
    sec.goals += fork_goals
    return sec


def floor_copy(store: Path, repo: str, variant: str, dest: Path) -> tuple[str, str, str]:
    """(v1's commit, module id, folder): a writable copy of `repo` v1's `variant` tree, which
    the floor imports with plain importlib (its bytecode lands next to it, as usual)."""
    org, name = repo.split("/")
    doc = json.loads((store / "index" / "v1" / org / f"{name}.json").read_text())
    commit = doc["refs"]["v1"]["commit"]
    entry = doc["commits"][commit]["variants"][variant]
    shutil.copytree(store / entry["tree"], dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return commit, str(entry["metadata_id"]), str(dest)


def call_ms(job: JobResult) -> float:
    dur = job.ranks[0].dur
    assert dur is not None
    return dur * 1e3


def ab_row(row: str, short: str) -> str:
    return f"{row.split(' (', maxsplit=1)[0]} @ {short}"


def check_paths(rows: dict[str, list[JobResult]], ab: tuple[str, Path] | None) -> None:
    warm = [j.ranks[0].extra for j in rows[KD_WARM]]
    rpc = [j.ranks[0].extra for j in rows[KD_RPC]]
    if ab:
        old = [j.ranks[0].extra for j in rows[ab_row(KD_WARM, ab[0])] + rows[ab_row(KD_RPC, ab[0])]]
        if not all(Path(x["client"]).is_relative_to(ab[1]) for x in old):
            raise RuntimeError(f"the {ab[0]} rows did not import {ab[0]}'s client: {old}")
        warm_old = old[: len(rows[ab_row(KD_WARM, ab[0])])]
        if not all(x["source"] == "index" and not x["grpc"] for x in warm_old):
            raise RuntimeError(f"{ab[0]}'s warm rows did not load the published pick: {warm_old}")
        if any(Path(x["client"]).is_relative_to(ab[1]) for x in warm + rpc):
            raise RuntimeError("this checkout's rows imported the other commit's client")
    if not all(x["source"] == "index" and not x["grpc"] and not x["ranked"] for x in warm):
        raise RuntimeError(
            f"kerneld warm did not load the published pick without grpc or ranking: {warm}"
        )
    if any(x["staged"] for x in warm):  # `staged` is read before `loaded_kernels` imports it
        raise RuntimeError(f"kerneld warm went through the staged loader, not _warm: {warm}")
    if not all(x["source"] == "daemon" and x["grpc"] for x in rpc):
        raise RuntimeError(f"kerneld RPC path did not ask the daemon: {rpc}")


def report(ctx: Ctx, rows: dict[str, list[JobResult]]) -> Section:
    a = ctx.args
    sec = Section("s1", "1. Warm load in one fresh process")
    sec.settings = f"{a.warm_runs} run(s) per loader after one warm-up; RTT row {a.rtt_ms:g} ms"
    calls = {name: [call_ms(j) for j in jobs] for name, jobs in rows.items()}
    totals = {
        name: [call_ms(j) + float(j.setup_extra["import_ms"]) for j in jobs]
        for name, jobs in rows.items()
    }
    floor = calls[FLOOR_ROW]
    warm = calls[KD_WARM]
    out: list[str] = [
        f"Loading `{REPO}` v1 (variant `{ctx.built.arch_variant}`) in a brand-new interpreter "
        "(not a fork: copy-on-write faults would slow the loader's Python several-fold) after "
        "`import torch`. *call* = the loading call alone; *import + "
        "call* adds importing the loader (`import kerneld_client` plus the lazy import of its "
        "warm path; `import kernels`). The kernels rows use the same local Hub server, at 0 ms "
        f"and at {a.rtt_ms:g} ms added to every request. Median (min-max) of {a.warm_runs} "
        "run(s); ratios paired within each run.",
        "",
        *table(
            ["loader", "call ms", "import + call ms", "call / floor (paired)"],
            [
                (
                    name,
                    fmt_stat(calls[name], 1),
                    fmt_stat(totals[name], 1),
                    fmt_stat(ratios(calls[name], floor), 1, "x"),
                )
                for name in rows
            ],
        ),
        "",
        *table(
            ["comparison (paired within a run)", "call", "import + call"],
            [
                (
                    "kerneld warm - floor",
                    fmt_stat([w - f for w, f in zip(warm, floor, strict=True)], 2, " ms"),
                    "",
                ),
                *[
                    (
                        f"{name} / kerneld warm",
                        fmt_stat(ratios(calls[name], warm), 1, "x"),
                        fmt_stat(ratios(totals[name], totals[KD_WARM]), 1, "x"),
                    )
                    for name in (K_ONLINE, k_rtt(a.rtt_ms), K_OFFLINE, KD_RPC)
                ],
            ],
        ),
    ]
    sec.lines = out
    diffs = [w - f for w, f in zip(warm, floor, strict=True)]
    speedup = ratios(calls[K_ONLINE], warm)
    sec.goals = [
        Goal(
            "kerneld warm call <= floor + 0.5 ms (issue 56)",
            median(diffs) <= 0.5,
            f"kerneld {median(warm):.2f} ms vs floor {median(floor):.2f} ms: "
            f"+{median(diffs):.2f} ms (median of paired differences)",
        ),
        Goal(
            "kerneld warm >= 10x faster than `kernels` warm online at 0 ms RTT",
            median(speedup) >= 10.0,
            f"{median(speedup):.1f}x (kernels {median(calls[K_ONLINE]):.1f} ms vs kerneld "
            f"{median(warm):.2f} ms per call; with imports "
            f"{median(ratios(totals[K_ONLINE], totals[KD_WARM])):.1f}x)",
        ),
    ]
    loader_and_call = [t - f for t, f in zip(totals[KD_WARM], floor, strict=True)]
    rpc = calls[KD_RPC]
    sec.goals += [
        Goal(
            "kerneld warm import + call <= floor + 2 ms (issues 22, 56)",
            median(loader_and_call) <= 2.0,
            f"{median(totals[KD_WARM]):.1f} ms vs floor {median(floor):.2f} ms: "
            f"+{median(loader_and_call):.1f} ms (what remains: the step-by-step tables below)",
        ),
        Goal(
            "the first RPC-path call <= 40 ms after `import torch` (issue 22)",
            median(rpc) <= 40.0,
            f"{median(rpc):.1f} ms (the loader's import before it: "
            f"{median(totals[KD_RPC]) - median(rpc):.1f} ms)",
        ),
    ]
    sec.data = {"calls": calls}
    return sec
