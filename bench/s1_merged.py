"""Scenario 1: what merging the warm path's modules into one would buy (issue 22, goal 1).

Importing the loader's warm path costs about 4 ms for two dozen modules, and an empty module
alone costs 60-80 µs to import on the 2-core machine. Is the goal (import + call <= floor +
2 ms) out of reach because of the layout (one module, one job), or because of how much code the
warm path runs? This answers it by measurement: one module is built from the very modules the
step-by-step job imported (their bodies in import order; the package's own imports dropped, and
a name bound to one of its modules bound to the merged module instead), and importing it is
timed against importing the same modules as they are, in alternating brand-new interpreters
after `import torch`, bytecode cached. The merged module is not a working loader (names of
different modules collide): it runs the same definitions once, with no module boundaries, so it
is what any re-layout of this code into one module would at best cost.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, fmt_stat, median, table

MERGED = "kerneld_warm_merged"

_TIMED = """
import json, sys, time
import torch
{prepare}
t0 = time.perf_counter()
{imports}
print(json.dumps({{"ms": (time.perf_counter() - t0) * 1e3, "n": len(MODULES)}}))
"""


@dataclass
class Merged:
    """Import ms, paired per run, and the size of the code imported."""

    source_lines: int
    as_they_are: list[float] = field(default_factory=list)
    merged: list[float] = field(default_factory=list)


def merged_source(modules: Sequence[str]) -> tuple[str, int]:
    """The bodies of `modules` (in an order where each comes after what it imports) as one
    module's source, and how many lines their sources have."""
    parts = [
        "from __future__ import annotations",
        "import sys as _sys",
        "_self = _sys.modules[__name__]",
    ]
    lines = 0
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"cannot find the source of {name}")
        text = Path(spec.origin).read_text()
        lines += text.count("\n")
        tree = ast.parse(text, spec.origin)
        body: list[ast.stmt] = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and _ours(node.module, node.level):
                # `from kerneld_client import _config` binds a module: bind the merged one
                body += [
                    _bind_self(a.asname or a.name)
                    for a in node.names
                    if f"{node.module}.{a.name}" in modules
                ]
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            elif isinstance(node, ast.Import) and any(_ours(a.name, 0) for a in node.names):
                body += [_bind_self((a.asname or a.name).split(".")[0]) for a in node.names]
            else:
                body.append(node)
        tree.body = body
        parts.append(f"# ---- {name}\n{ast.unparse(tree)}")
    return "\n".join(parts) + "\n", lines


def _ours(module: str | None, level: int) -> bool:
    return level > 0 or (module or "").split(".")[0] == "kerneld_client"


def _bind_self(name: str) -> ast.stmt:
    return ast.parse(f"{name} = _self").body[0]


def measure(env: Mapping[str, str], modules: Sequence[str], runs: int, work: Path) -> Merged:
    """Import ms of the modules as they are and merged, paired per run (one warm-up each)."""
    folder = work / "merged"
    folder.mkdir(parents=True, exist_ok=True)
    source, lines = merged_source(modules)
    (folder / f"{MERGED}.py").write_text(source)
    result = Merged(lines)
    listed = f"MODULES = {list(modules)!r}"
    as_they_are = _TIMED.format(
        prepare=listed,
        imports="import kerneld_client\nkerneld_client.get_kernel\n"
        + "".join(f"import {m}\n" for m in modules),
    )
    merged = _TIMED.format(
        prepare=f"{listed}\nsys.path.insert(0, {str(folder)!r})", imports=f"import {MERGED}"
    )
    for run_i in range(-1, runs):  # -1: writes the bytecode
        for into, code in ((result.as_they_are, as_they_are), (result.merged, merged)):
            done = subprocess.run(
                [sys.executable, "-c", code],
                env=dict(env),
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            if run_i >= 0:
                into.append(float(json.loads(done.stdout.splitlines()[-1])["ms"]))
    return result


def report(result: Merged, n_modules: int, call_over_floor: float) -> list[str]:
    """A table, and a sentence on what it means for goal 1."""
    as_they_are, merged = result.as_they_are, result.merged
    saved = [a - m for a, m in zip(as_they_are, merged, strict=True)]
    goal = [m + call_over_floor for m in merged]
    return [
        "",
        "**The warm path merged into one module** (`bench/s1_merged.py`): is goal 1's import + "
        "call out of reach because of the layout or because of the code? The same "
        f"{n_modules} modules, their bodies concatenated into one module (not a working "
        "loader: it runs the same definitions once, with no module boundaries), imported in "
        "fresh interpreters after `import torch`, alternating with the modules as they are. "
        "Median (min-max) ms:",
        "",
        *table(
            ["import of the warm path's code", "ms"],
            [
                (f"as it is: {n_modules} modules", fmt_stat(as_they_are, 2)),
                ("merged into one module", fmt_stat(merged, 2)),
                ("saved by merging (paired)", fmt_stat(saved, 2)),
                (
                    f"merged + the warm call's cost over the floor ({call_over_floor:.2f} ms), "
                    "against goal 1's 2 ms",
                    fmt_stat(goal, 2),
                ),
            ],
        ),
        "",
        *_what_fits(result, n_modules, call_over_floor),
    ]


def _what_fits(result: Merged, n_modules: int, call_over_floor: float) -> list[str]:
    """Goal 1's budget in modules and lines, at this run's cost per module and per line."""
    saved = median([a - m for a, m in zip(result.as_they_are, result.merged, strict=True)])
    left = median(result.merged) + call_over_floor
    if left <= 2.0:
        return [f"Merged, import + call would be floor + {left:.1f} ms: within goal 1."]
    per_module = saved / max(n_modules - 1, 1)
    per_line = median(result.merged) / result.source_lines
    budget = 2.0 - call_over_floor
    fits = {k: int((budget - per_module * (k - 1)) / per_line) for k in (1, 5)}
    return [
        f"Merging every module would save {saved:.1f} ms and still leave import + call at "
        f"floor + {left:.1f} ms: the rest is the code itself (unmarshalling and running the "
        f"definitions of {result.source_lines:,} lines of source), not the number of modules. "
        f"At this run's {per_module * 1e3:.0f} µs per module and {per_line * 1e3:.2f} µs per "
        f"line, goal 1 leaves {budget:.2f} ms for the import: one module of at most "
        f"{fits[1]:,} lines, or five of at most {fits[5]:,} in all (today {n_modules} modules, "
        f"{result.source_lines:,} lines), i.e. a second, slimmer implementation of the warm "
        "path beside the full one."
    ]
