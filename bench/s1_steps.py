"""Scenario 1, step by step: where kerneld's warm call and its imports spend their time.

Issue 22 asks for what remains of platform detection, trust checks and the lock to be measured
step by step. One more fresh process per run (same store and environment as the kerneld warm
row) wraps each stage of the warm path in a timer and imports the loader with
`PYTHONPROFILEIMPORTTIME=1`, its stderr sent to a file while the loader's modules are imported
and the call runs. The wrappers add about a microsecond per stage, and the import log a few per
module, so these figures sum to a little more than the warm row's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bench.common import fmt_stat, median, table
from bench.zygote import JobResult

#: (module alias in the job, function, what it does): the warm path's stages, in call order
#: (the warm fast path, `kerneld_client._warm`, issue 56).
STEPS: Sequence[tuple[str, str, str]] = (
    ("_warm", "platform_key", "platform: detection and its fingerprint"),
    ("_warm", "store_root", "store root: resolve, owner and modes of it and every parent"),
    ("_warm", "index_doc", "published index: read, owner and mode, parse, format checks"),
    ("_warm", "publisher_trusted", "publishers.json: the daemon's `[trust]` verdict"),
    ("_warm", "hold", "tree lock: the OFD read lock"),
    ("_warm", "check_tree", "tree trust: its owner and modes"),
    ("_warm", "_metadata", "metadata.json: read and parse"),
    ("_warm", "_device_ok", "device check against the build's archs"),
    ("_warm", "_exec", "import of the variant (the floor's work, bytecode cache)"),
    ("_warm", "_note_newer_version", "`kernels`' notice: version N is available"),
)

SETUP = """
import os, sys, tempfile, time
import torch
_log = tempfile.TemporaryFile()
_stderr = os.dup(2)
os.dup2(_log.fileno(), 2)  # the import log of the loader's modules (PYTHONPROFILEIMPORTTIME)
_t0 = time.perf_counter()
import kerneld_client
# an import statement, not the lazy attribute alone: `-X importtime` does not see a module
# imported by importlib.import_module (the package's __getattr__), only what that one imports
from kerneld_client import _warm
get_kernel = kerneld_client.get_kernel
SETUP_EXTRA = {"import_ms": (time.perf_counter() - _t0) * 1e3}
STEP_MS = {}
def _timed(inner, label):
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            STEP_MS[label] = STEP_MS.get(label, 0.0) + (time.perf_counter() - t) * 1e3
    return timed
for _alias, _name, _label in STEPS:
    _mod = globals()[_alias]
    setattr(_mod, _name, _timed(getattr(_mod, _name), _label))
def load(repo):
    global MOD
    MOD = get_kernel(repo, version=1, policy="error")
    return MOD
def _imports():
    os.dup2(_stderr, 2)
    _log.seek(0)
    out = {}
    for line in _log.read().decode().splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip().startswith("kerneld_client"):
            out[parts[2].strip()] = int(parts[0].split(":")[1]) / 1e3
    return out
def INFO():
    return {
        "steps": STEP_MS,
        "imports": _imports(),
        "ranked": "kerneld_client.variants.choice" in sys.modules,
        "source": kerneld_client.loaded_kernels()[0].source,
    }
"""


def setup_code(check: str) -> str:
    """The job's setup: the stage list inlined, then the kernel check of scenario 1."""
    return f"STEPS = {list(STEPS)!r}\n" + SETUP + check


def env_for(env: Mapping[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPROFILEIMPORTTIME": "1"}


def report(jobs: Sequence[JobResult], warm_calls: Sequence[float]) -> list[str]:
    """Two tables: the call's stages, and the loader's modules by their own import time."""
    infos = [j.ranks[0].extra for j in jobs]
    if any(i["ranked"] or i["source"] != "index" for i in infos):
        raise RuntimeError(f"the step-by-step warm load ranked or left the index: {infos}")
    calls = [(j.ranks[0].dur or 0.0) * 1e3 for j in jobs]
    rows: list[tuple[str, str, str]] = []
    accounted = [0.0] * len(jobs)
    for _alias, _name, label in STEPS:
        values = [float(i["steps"].get(label, 0.0)) for i in infos]
        accounted = [a + v for a, v in zip(accounted, values, strict=True)]
        share = median(values) / median(calls) if median(calls) else 0.0
        rows.append((label, fmt_stat(values, 3), f"{share:.0%}"))
    rest = [c - a for c, a in zip(calls, accounted, strict=True)]
    rows.append(("the rest: request checks, memo, registry, glue", fmt_stat(rest, 3), ""))
    rows.append(("the whole call (with the timers)", fmt_stat(calls, 3), "100%"))
    modules = sorted(
        {m for i in infos for m in i["imports"]},
        key=lambda m: -median([float(i["imports"].get(m, 0.0)) for i in infos]),
    )
    mod_rows = [
        (f"`{m}`", fmt_stat([float(i["imports"].get(m, 0.0)) for i in infos], 2)) for m in modules
    ]
    total = [sum(float(v) for v in i["imports"].values()) for i in infos]
    mod_rows.append((f"all {len(modules)} modules", fmt_stat(total, 2)))
    return [
        "",
        "**Step by step.** Where the warm call goes (one more fresh process per run, each stage "
        f"timed; the unwrapped warm call above: {median(warm_calls):.2f} ms). Median (min-max) "
        "ms:",
        "",
        *table(["stage of the warm call", "ms", "share"], rows),
        "",
        "The warm path's imports, each module's own time (`-X importtime`, self: finding "
        "it, reading and unmarshalling its bytecode, running its body), largest first:",
        "",
        *table(["module", "ms"], mod_rows),
    ]
