"""Scenario 1's warm call, counted: deterministic proxies for what the warm path costs.

On a shared, loaded machine a wall-clock A/B of a 1 ms difference is noise (bench/RESULTS.md,
section 1). This measures what does not depend on the load, for this checkout's client and,
with `--ab COMMIT`, that commit's client, against the same daemon and published store:

- *calls*: cProfile's function calls (all, and by `kerneld_client` function) of the import
  (`import kerneld_client` + the lazy `get_kernel`) and of the first warm call, in one fresh
  process after `import torch`; and of a second call of the same kernel (the memo);
- *lines*: `sys.settrace` line events of the same, split into `kerneld_client`'s, the standard
  library's and the rest (the kernel's own import is the rest: the same for both clients);
- *cpu*: `time.process_time` of the import and of the call (and the minor page faults), the
  clients alternating: in `--forks` children forked from one parent that imported torch (cheap,
  but copy-on-write faults included) and in `--fresh` brand-new processes (as the bench's
  scenario 1); median and the paired difference. CPU time, not wall: a preempted process does
  not count the time it waited, though a loaded machine still inflates it (shared caches).

Both clients are put on `sys.path` first (found the same way), bytecode compiled. Usage:
`python -m bench.warm_counts [--ab COMMIT] [--forks N] [--fresh N]`; prints a markdown report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from bench import s1_ab
from bench.common import base_env, fmt_stat, table
from bench.scenario import DAEMON_CONFIG
from examples.kernels.build import build_examples, make_hub
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

ROOT = Path(__file__).resolve().parents[1]
REPO = f"{ORG}/activation"

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    MODE, CLIENTS, RUNS, REPO = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    import torch

    def load(client):
        sys.path.insert(0, client)
        import kerneld_client
        assert kerneld_client.__file__.startswith(client), kerneld_client.__file__
        return kerneld_client

    def checked(kc, mod):
        assert "grpc" not in sys.modules, "grpc imported"
        assert "kerneld_client.loader" not in sys.modules, "the staged loader imported"
        loaded = sys.modules["kerneld_client._loads"].loaded_kernels()  # not the lazy name's
        assert loaded and loaded[0].source == "index", loaded
        return mod

    def run_counts(wrap, client):
        out = {}
        kc = wrap("import", lambda: load(client), out)
        get = wrap("import2", lambda: kc.get_kernel, out)
        mod = wrap("call", lambda: get(REPO, version=1, policy="error"), out)
        checked(kc, mod)
        wrap("memo", lambda: get(REPO, version=1, policy="error"), out)
        return out

    def profiled(label, fn, out):
        import cProfile, pstats, io
        prof = cProfile.Profile()
        prof.enable()
        value = fn()
        prof.disable()
        st = pstats.Stats(prof, stream=io.StringIO())
        funcs = {}
        for (path, line, name), row in st.stats.items():
            if "kerneld_client" in path:
                key = path.rsplit("kerneld_client", 1)[1].lstrip("/") + ":" + name
                funcs[key] = funcs.get(key, 0) + row[1]
        out[label] = {"calls": st.total_calls, "funcs": funcs}
        return value

    STDLIB = os.path.dirname(os.__file__)

    def traced(label, fn, out):
        events = {"kerneld_client": 0, "stdlib": 0, "other": 0}
        def local(frame, event, arg):
            if event == "line":
                path = frame.f_code.co_filename
                if "kerneld_client" in path:
                    events["kerneld_client"] += 1
                elif path.startswith(STDLIB) and "site-packages" not in path:
                    events["stdlib"] += 1
                else:
                    events["other"] += 1
            return local
        sys.settrace(lambda frame, event, arg: local)
        try:
            value = fn()
        finally:
            sys.settrace(None)
        out[label] = events
        return value

    def cpu_child(client, w):
        import resource
        pt, pc = time.process_time, time.perf_counter
        ru = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        f0, t0, w0 = ru(), pt(), pc()
        kc = load(client)
        get = kc.get_kernel
        t1, w1 = pt(), pc()
        f1 = ru()
        mod = get(REPO, version=1, policy="error")
        t2, w2 = pt(), pc()
        f2 = ru()
        checked(kc, mod)
        os.write(w, json.dumps([t1 - t0, t2 - t1, w1 - w0, w2 - w1, f1 - f0, f2 - f1]).encode())

    def fork_one(client):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)  # kernels' version notice
                cpu_child(client, w)
                code = 0
            except BaseException as exc:
                os.write(w, json.dumps({"error": repr(exc)}).encode())
                code = 1
            os._exit(code)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        got = json.loads(data)
        if isinstance(got, dict):
            raise SystemExit(f"{client}: {got['error']}")
        return got

    if MODE == "profile":
        print(json.dumps(run_counts(profiled, CLIENTS[0])))
    elif MODE == "trace":
        print(json.dumps(run_counts(traced, CLIENTS[0])))
    elif MODE == "fresh":
        cpu_child(CLIENTS[0], 1)
        print()
    else:
        import gc
        gc.freeze()
        results = {c: [] for c in CLIENTS}
        for i in range(RUNS):
            order = CLIENTS if i % 2 == 0 else CLIENTS[::-1]
            for c in order:
                results[c].append(fork_one(c))
        print(json.dumps(results))
    """
)


def child(mode: str, clients: list[str], env: dict[str, str], runs: int = 0) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, json.dumps(clients), str(runs), REPO],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} child failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compiled_client(dest: Path) -> Path:
    """A copy of this checkout's `client/` with its bytecode (the worktree's own may be stale)."""
    shutil.copytree(ROOT / "client" / "kerneld_client", dest / "kerneld_client")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)], check=True)
    return dest


CPU_ROWS = (
    "import",
    "call",
    "import wall",
    "call wall",
    "import: minor faults",
    "call: minor faults",
)


def fresh(paths: list[str], env: dict[str, str], runs: int) -> dict[str, list[list[float]]]:
    """`runs` brand-new processes per client (no fork: no copy-on-write faults), alternating."""
    out: dict[str, list[list[float]]] = {p: [] for p in paths}
    for i in range(runs):
        for p in paths if i % 2 == 0 else paths[::-1]:
            out[p].append(child("fresh", [p], env))
    return out


def report(
    names: list[str],
    prof: dict[str, Any],
    trace: dict[str, Any],
    tables: list[tuple[str, dict[str, list[list[float]]]]],
) -> list[str]:
    lines = [
        "function calls (cProfile) and line events (settrace), one fresh process each (import: the "
        "package; import2: its lazy `get_kernel`; call: the first warm call; memo: a second one):",
        "",
    ]
    rows = []
    for stage in ("import", "import2", "call", "memo"):
        row: list[object] = [stage]
        for n in names:
            t = trace[n][stage]
            row += [prof[n][stage]["calls"], t["kerneld_client"], t["stdlib"], t["other"]]
        rows.append(row)
    head = ["stage"]
    for n in names:
        head += [f"{n} calls", f"{n} lines: ours", "stdlib", "other"]
    lines += table(head, rows)
    lines += ["", "kerneld_client functions called by the first warm call:", ""]
    funcs = sorted({f for n in names for f in prof[n]["call"]["funcs"]})
    lines += table(
        ["function", *names],
        [[f, *(prof[n]["call"]["funcs"].get(f, 0) for n in names)] for f in funcs],
    )
    for title, cpu in tables:
        lines += ["", f"{title}, {len(cpu[names[0]])} per client, median (min-max):", ""]
        crow = []
        for i, what in enumerate(CPU_ROWS):
            scale = 1e3 if "faults" not in what else 1
            vals = {n: [r[i] * scale for r in cpu[n]] for n in names}
            row = [what, *(fmt_stat(vals[n], 3) for n in names)]
            if len(names) == 2:
                diffs = [a - b for a, b in zip(vals[names[0]], vals[names[1]], strict=True)]
                row.append(fmt_stat(diffs, 3))
            crow.append(row)
        diff_head = [f"{names[0]} - {names[1]} (paired)"] if len(names) == 2 else []
        lines += table(["ms (faults: count)", *names, *diff_head], crow)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ab", help="another commit whose client runs beside this checkout's")
    ap.add_argument("--forks", type=int, default=100, help="forked children per client (CPU)")
    ap.add_argument("--fresh", type=int, default=10, help="brand-new processes per client (CPU)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warm-counts-"))
    try:
        built = build_examples()
        hub = make_hub(work / "hub", built=built)
        clients = {"this": compiled_client(work / "this")}
        if a.ab:
            short, path = s1_ab.checkout_client(a.ab, work / "ab")
            clients[short] = path
        names = list(clients)
        paths = [str(clients[n]) for n in names]
        with (
            HubServer(hub.root, trusted_orgs={ORG: True}) as server,
            DaemonProcess(work / "daemon", hub_endpoint=server.url, config=DAEMON_CONFIG) as d,
        ):
            env = base_env(work / "home")
            env["KERNELD_SOCKET"] = str(d.user_socket)
            env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
            cold = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import kerneld_client as k, sys;"
                    f"k.get_kernel({REPO!r}, version=1, policy='error');"
                    "print(k.loaded_kernels()[0].source)",
                ],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            assert cold.stdout.strip() == "daemon", cold
            child("cpu", paths, env, runs=1)  # warm-up: bytecode caches
            prof = {n: child("profile", [p], env) for n, p in zip(names, paths, strict=True)}
            trace = {n: child("trace", [p], env) for n, p in zip(names, paths, strict=True)}
            tables = []
            if a.forks:
                forked = child("cpu", paths, env, runs=a.forks)
                tables.append(
                    (
                        "children forked from one parent that imported torch (copy-on-write faults"
                        " included)",
                        {n: forked[p] for n, p in zip(names, paths, strict=True)},
                    )
                )
            if a.fresh:
                got = fresh(paths, env, a.fresh)
                tables.append(
                    ("brand-new processes", {n: got[p] for n, p in zip(names, paths, strict=True)})
                )
        load = os.getloadavg()[0]
        out = report(names, prof, trace, tables)
        print("\n".join([f"load average (1 min) at the end: {load:.1f}", "", *out]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
