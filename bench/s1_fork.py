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

The floor (`importlib` of copies of the same two variant folders, in the same three modes)
runs beside it: a plain import of a new kernel pays the fork's copy-on-write faults too (the
dlopen and the op registration write into torch's pages), so its forked / fresh ratio is the
least any loader can have, and kerneld's own cost in the child is what it adds to the floor.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

from bench.common import fmt_stat, median, ratios, table
from bench.scenario import Goal
from bench.zygote import run_fresh

Job = dict[str, object]

KERNELD = """
import kerneld_client
get_kernel = kerneld_client.get_kernel  # the package is lazy: imports the warm path now
get = lambda repo: get_kernel(repo, version=1, policy="error")
loaded_sources = lambda: sorted({k.source for k in kerneld_client.loaded_kernels()})
"""

#: The floor: importlib of a writable copy of the variant folder (bytecode next to it), once
#: per module id, as a memo would.
FLOOR = """
import importlib.util
def get(repo):
    module_id, folder = FOLDERS[repo]
    if module_id not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_id, folder + "/__init__.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_id] = module
        spec.loader.exec_module(module)
    return sys.modules[module_id]
loaded_sources = lambda: ["floor"]
"""

JOB = textwrap.dedent(
    """
    import gc, json, os, sys, time
    import torch
    # LOADER
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
        out = {
            "new_ms": new_ms,
            "same_ms": same_ms,
            "same_module": same is parent_kernel,
            "grpc": "grpc" in sys.modules,
            "sources": loaded_sources(),
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


def run_one(
    env: Mapping[str, str], loader: str, mode: str, shared: str, new: str, floors: Floors
) -> Job:
    head = f"MODE = {mode!r}\nSHARED = {shared!r}\nNEW = {new!r}\nFOLDERS = {dict(floors)!r}\n"
    return run_fresh(head + JOB.replace("# LOADER\n", loader), env)


MODES = ("fresh", "sequel", "forked")
#: repo -> (module id, a writable copy of its variant folder): the floor's kernels.
Floors = Mapping[str, tuple[str, str]]


def measure(
    env: Mapping[str, str], shared: str, new: str, runs: int, floors: Floors
) -> list[dict[str, Job]]:
    """`runs` runs of the three modes, kerneld's and the floor's (`floor-<mode>`), after one
    warm-up run, in turn."""
    out = []
    for i in range(runs + 1):
        run = {mode: run_one(env, KERNELD, mode, shared, new, floors) for mode in MODES}
        run |= {f"floor-{m}": run_one(env, FLOOR, m, shared, new, floors) for m in MODES}
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
    ms = {mode: [_ms(r[mode]["new_ms"]) for r in runs] for mode in runs[0]}
    same = [_ms(c["same_ms"]) for c in children]
    vs_fresh = ratios(ms["forked"], ms["fresh"])
    vs_sequel = ratios(ms["forked"], ms["sequel"])
    floor_vs_fresh = ratios(ms["floor-forked"], ms["floor-fresh"])
    # What kerneld adds to the floor, in the child and in a fresh process.
    own_forked = [k - f for k, f in zip(ms["forked"], ms["floor-forked"], strict=True)]
    own_fresh = [k - f for k, f in zip(ms["fresh"], ms["floor-fresh"], strict=True)]
    own_ratio = ratios(own_forked, own_fresh)
    lines = [
        "",
        "**Forked workers.** One call for `relu2` v1 in a fresh process (its first kernel), in "
        "a process that loaded `activation` v1 first (*sequel*), and in a child forked from "
        "that process after `gc.freeze()` (*forked*), which also asks for `activation` v1 "
        "again; the floor does the same with `importlib` on copies of the two variant folders. "
        f"Median (min-max) of {len(runs)} runs:",
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
                ("floor, a new kernel: fresh process", fmt_stat(ms["floor-fresh"], 2)),
                ("floor, a new kernel: forked child", fmt_stat(ms["floor-forked"], 2)),
                ("floor: forked / fresh (paired)", fmt_stat(floor_vs_fresh, 2, "x")),
                (
                    "kerneld's own cost (minus the floor): forked / fresh (paired)",
                    fmt_stat(own_ratio, 2, "x"),
                ),
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
            f"{median(vs_fresh):.2f}x (the floor itself: {median(floor_vs_fresh):.2f}x; "
            f"kerneld's own cost: {median(own_ratio):.2f}x)",
        )
    ]
    return lines, goals
