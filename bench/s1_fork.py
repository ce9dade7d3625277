"""Scenario 1, forked workers: what a process forked from a parent that loaded kernels pays.

DataLoader workers and `torch.multiprocessing` with fork start as copies of a parent that
already imported torch and loaded its kernels. Issue 22 asks that such a child get the same
kernel with no RPC and no second import, and that a new kernel in the child cost no more than
2x what it costs a fresh process (copy-on-write faults on the parent's objects slowed the
loader's Python 3-5x in the bench's forked ranks).

Three brand-new processes per run, each having imported torch and the loader (not timed), then
timing one call for `relu2` v1:
- *fresh*: it is the process's first kernel (a worker started with `spawn`; the goal's base);
- *sequel*: the process loaded `activation` v1 first (the same parent as below, no fork);
- *forked*: the process loaded `activation` v1, froze its objects (`gc.freeze()`, as a
  DataLoader parent should) and forked; the child loads `relu2` v1 (and asks for `activation`
  v1 again: the memo must answer, with no RPC and no import).
forked / sequel is what the fork itself costs.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

from bench.common import fmt_stat, median, ratios, table
from bench.scenario import Goal
from bench.zygote import run_fresh

Job = dict[str, object]

JOB = textwrap.dedent(
    """
    import gc, json, os, sys, time
    import torch
    import kerneld_client
    get_kernel = kerneld_client.get_kernel  # the package is lazy: imports the warm path now
    get = lambda repo: get_kernel(repo, version=1, policy="error")
    parent_kernel = None if MODE == "fresh" else get(SHARED)
    gc.freeze()
    def load_new():
        t0 = time.perf_counter()
        get(NEW)
        return (time.perf_counter() - t0) * 1e3
    if MODE != "forked":
        print(json.dumps({"new_ms": load_new()}))
        sys.exit(0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        t0 = time.perf_counter()
        same = get(SHARED)
        same_ms = (time.perf_counter() - t0) * 1e3
        new_ms = load_new()
        loaded = kerneld_client.loaded_kernels()
        out = {
            "new_ms": new_ms,
            "same_ms": same_ms,
            "same_module": same is parent_kernel,
            "grpc": "grpc" in sys.modules,
            "sources": sorted({k.source for k in loaded}),
        }
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    print(data.decode())
    """
)


def run_one(env: Mapping[str, str], mode: str, shared: str, new: str) -> Job:
    code = f"MODE = {mode!r}\nSHARED = {shared!r}\nNEW = {new!r}\n" + JOB
    return run_fresh(code, env)


MODES = ("fresh", "sequel", "forked")


def measure(env: Mapping[str, str], shared: str, new: str, runs: int) -> list[dict[str, Job]]:
    """`runs` runs of the three modes after one warm-up run, in turn."""
    out = []
    for i in range(runs + 1):
        run = {mode: run_one(env, mode, shared, new) for mode in MODES}
        if i:
            out.append(run)
    return out


def _ms(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)


def report(runs: Sequence[dict[str, Job]]) -> tuple[list[str], list[Goal]]:
    children = [r["forked"] for r in runs]
    if not all(c["same_module"] and not c["grpc"] for c in children):
        raise RuntimeError(f"a forked child asked the daemon or imported twice: {children}")
    ms = {mode: [_ms(r[mode]["new_ms"]) for r in runs] for mode in MODES}
    same = [_ms(c["same_ms"]) for c in children]
    vs_fresh = ratios(ms["forked"], ms["fresh"])
    vs_sequel = ratios(ms["forked"], ms["sequel"])
    lines = [
        "",
        "**Forked workers.** One call for `relu2` v1 in a fresh process (its first kernel), in "
        "a process that loaded `activation` v1 first (*sequel*), and in a child forked from "
        "that process after `gc.freeze()` (*forked*), which also asks for `activation` v1 "
        f"again. Median (min-max) of {len(runs)} runs:",
        "",
        *table(
            ["", "ms"],
            [
                ("a new kernel: fresh process (first kernel)", fmt_stat(ms["fresh"], 2)),
                ("a new kernel: sequel (no fork)", fmt_stat(ms["sequel"], 2)),
                ("a new kernel: forked child", fmt_stat(ms["forked"], 2)),
                ("forked / fresh (paired)", fmt_stat(vs_fresh, 2, "x")),
                (
                    "forked / sequel (paired): the fork's own cost",
                    fmt_stat(vs_sequel, 2, "x"),
                ),
                ("the parent's kernel again, in the child (the memo)", fmt_stat(same, 3)),
            ],
        ),
    ]
    goals = [
        Goal(
            "forked child: the parent's kernel without RPC or a second import; a new one "
            "<= 2x a fresh process (issue 22)",
            median(vs_fresh) <= 2.0,
            f"same module, no grpc in {len(children)} of {len(children)} children; a new kernel "
            f"{median(ms['forked']):.2f} ms forked vs {median(ms['fresh']):.2f} ms fresh = "
            f"{median(vs_fresh):.2f}x",
        )
    ]
    return lines, goals
