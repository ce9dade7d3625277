"""Scenario 1's first RPC-path call in CPU time (issue 56, deliverable 4): where it goes.

The bench's goal row ("the first RPC-path call <= 40 ms after `import torch`", `s1_warm`) is wall
time, one process per round; on the shared 2-core machine that is mostly other processes' load.
This measures `time.process_time()` (the process's CPU, grpc's own threads included) of the same
call in brand-new interpreters, after `import torch` and `gc.freeze()` as `bench.zygote`'s fresh
jobs do, over many rounds; each round runs every row once, in turn, so rows are paired:

- *kerneld RPC path*: `get_kernel(activation, version=1)` (the package and its warm path are
  imported before the clock starts) with KERNELD_REF_MAX_AGE=0 (the published pick is
  re-checked with the daemon: the staged loader, grpc, a channel, Resolve, then the import), as
  s1_warm's RPC row; with `--ab COMMIT` also that commit's client (`s1_ab`), in the same rounds;
- *floor*: `import grpc` + the messages of a Resolve (`resolve_pb2`) + one unary call (a
  ResolveRequest) to a bare grpcio server on a unix socket in another process, + importlib of a
  copy of the variant folder: what any RPC path built on grpcio pays. Its parts are also
  reported apart.

`--importtime` adds `-X importtime` of the RPC path's call (the modules it imports, after torch),
`--profile` cProfile's top functions of it; both in one extra process each, after the rounds.

    python -m bench.s1_rpc_cpu --runs 15 [--ab COMMIT] [--importtime N] [--profile]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench import s1_ab
from bench.common import ROOT, base_env, fmt_stat, log, median, table
from bench.hubrepos import make_bench_hub
from bench.s1_warm import REPO, floor_copy
from bench.scenario import DAEMON_CONFIG
from examples.kernels.build import build_examples
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

#: Runs in every measured process: torch, then the timed body; prints one JSON line.
CHILD = r"""
import gc, json, sys, time
import torch
BODY_SETUP
gc.freeze()
sys.stderr.write("@@timed\n"); sys.stderr.flush()
before = set(sys.modules)
out = {}
c0 = time.process_time(); w0 = time.perf_counter()
BODY
c1 = time.process_time(); w1 = time.perf_counter()
out.update(cpu_ms=(c1 - c0) * 1e3, wall_ms=(w1 - w0) * 1e3,
           modules=len(set(sys.modules) - before))
print(json.dumps(out))
"""

#: As s1_warm: the package and its warm path are imported before the clock starts.
KERNELD_SETUP = """
import kerneld_client
get_kernel = kerneld_client.get_kernel
"""
KERNELD = """
mod = get_kernel(REPO, version=1, policy="error")
out["source"] = kerneld_client.loaded_kernels()[0].source
out["client"] = kerneld_client.__file__
"""

# The floor's three parts, each timed on its own inside the one timed body.
FLOOR = """
t0 = time.process_time()
import grpc
from kerneld_client.proto import resolve_pb2 as pb
t1 = time.process_time()
ch = grpc.insecure_channel("unix:" + ECHO)
rpc = ch.unary_unary("/kerneld.v1.Kernels/Resolve",
                     request_serializer=pb.ResolveRequest.SerializeToString,
                     response_deserializer=pb.ResolveResponse.FromString)
rpc(pb.ResolveRequest(kernel=pb.KernelRef(repo_id=REPO, version=1)), timeout=5)
ch.close()
t2 = time.process_time()
import importlib.util
spec = importlib.util.spec_from_file_location(MODULE_ID, FOLDER + "/__init__.py")
m = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = m
spec.loader.exec_module(m)
t3 = time.process_time()
out.update(import_ms=(t1 - t0) * 1e3, call_ms=(t2 - t1) * 1e3, kernel_ms=(t3 - t2) * 1e3)
"""

#: A bare grpcio server answering every unary call on /kerneld.v1.Kernels/Resolve with an empty
#: message (no deserialisation, no work): the other side of the floor's call.
ECHO = r"""
import sys, threading
from concurrent import futures
import grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
handler = grpc.method_handlers_generic_handler(
    "kerneld.v1.Kernels", {"Resolve": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"")})
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("unix:" + sys.argv[1])
server.start()
print("up", flush=True)
sys.stdin.read()
server.stop(0)
"""


def child(body: str, setup: str = "", **subs: str) -> str:
    code = CHILD.replace("BODY_SETUP", setup).replace("BODY", textwrap.dedent(body))
    for key, value in subs.items():
        code = code.replace(key, repr(value))
    return code


def run_child(code: str, env: Mapping[str, str], *flags: str) -> tuple[dict[str, Any], str]:
    """(the child's JSON line, its stderr after the timed marker)."""
    proc = subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"a measured process failed:\n{proc.stderr[-3000:]}")
    after = proc.stderr.split("@@timed\n", 1)[-1]
    return json.loads(proc.stdout.strip().splitlines()[-1]), after


def importtime_self(log_text: str) -> dict[str, int]:
    """`-X importtime` lines -> {module: self microseconds}."""
    out = {}
    for line in log_text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (p.strip() for p in line[len("import time:") :].split("|"))
        out[name] = int(self_us)
    return out


def importtime_table(
    logs: list[dict[str, int]], floor: list[dict[str, int]], top: int
) -> list[str]:
    """Median self time per module over `logs`; whether the floor imports it too."""
    names = {n for log_ in logs for n in log_}
    med = {n: median([log_.get(n, 0) for log_ in logs]) for n in names}
    in_floor = {n for log_ in floor for n in log_}
    extra = [n for n in names if n not in in_floor]
    out = [
        f"{len(names)} modules, {sum(med.values()) / 1e3:.1f} ms self time in all (median of "
        f"{len(logs)} logs); {len(extra)} of them not imported by the floor: "
        f"{sum(med[n] for n in extra) / 1e3:.1f} ms",
        "",
    ]
    ranked = sorted(names, key=lambda n: -med[n])[:top]
    out += table(
        ["self ms", "module", "floor imports it"],
        [(f"{med[n] / 1e3:.2f}", f"`{n}`", "yes" if n in in_floor else "**no**") for n in ranked],
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--ab", help="another commit whose client runs in the same rounds")
    p.add_argument("--importtime", type=int, default=0, metavar="N", help="N logs of each")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="kerneld-s1rpc-"))
    (work / "home").mkdir()
    echo = None
    try:
        built = build_examples()
        hub = make_bench_hub(work / "hub", built)
        with (
            HubServer(hub, trusted_orgs={ORG: True}) as server,
            DaemonProcess(work / "daemon", hub_endpoint=server.url, config=DAEMON_CONFIG) as daemon,
        ):
            env = base_env(work / "home")
            env["KERNELD_SOCKET"] = str(daemon.user_socket)
            env["KERNELD_BYTECODE_CACHE"] = str(work / "bytecode")
            rpc_env = {**env, "KERNELD_REF_MAX_AGE": "0"}
            kd = child(KERNELD, KERNELD_SETUP, REPO=REPO)
            first, _ = run_child(kd, env)  # cold: the daemon fetches, the index publishes
            log(f"cold load: {first}")
            _, module_id, floor_dir = floor_copy(
                daemon.store_root, REPO, built.arch_variant, work / "floor"
            )
            sock = Path(tempfile.mkdtemp(prefix="kd-echo-")) / "echo.sock"
            echo = subprocess.Popen(
                [sys.executable, "-c", ECHO, str(sock)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert echo.stdout is not None and echo.stdout.readline().strip() == "up"
            floor = child(FLOOR, REPO=REPO, ECHO=str(sock), MODULE_ID=module_id, FOLDER=floor_dir)
            rows: dict[str, tuple[str, dict[str, str]]] = {
                "kerneld RPC path (this checkout)": (kd, rpc_env),
                "floor: grpc + stubs + 1 unary call + importlib": (floor, env),
            }
            if a.ab:
                short, client = s1_ab.checkout_client(a.ab, work / "ab")
                rows[f"kerneld RPC path @ {short}"] = (kd, s1_ab.env_with(rpc_env, client))
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in rows}
            for i in range(-1, a.runs):  # -1: warm-up (bytecode)
                for name, (code, e) in rows.items():
                    doc, _ = run_child(code, e)
                    if "source" in doc and doc["source"] != "daemon":
                        raise RuntimeError(f"{name} did not ask the daemon: {doc}")
                    if i >= 0:
                        results[name].append(doc)
                if i >= 0:
                    log(
                        f"round {i + 1}/{a.runs}: "
                        + ", ".join(f"{n[:24]} {r[-1]['cpu_ms']:.1f}" for n, r in results.items())
                    )
            lines = report(results, a.runs)
            if a.importtime:
                mine, floors = [], []
                for _ in range(a.importtime):
                    mine.append(importtime_self(run_child(kd, rpc_env, "-X", "importtime")[1]))
                    floors.append(importtime_self(run_child(floor, env, "-X", "importtime")[1]))
                lines += ["", "`-X importtime` of the RPC path's call (this checkout):", ""]
                lines += importtime_table(mine, floors, a.top)
                lines += ["", "`-X importtime` of the floor:", ""]
                lines += importtime_table(floors, floors, a.top)
            if a.profile:
                prof = KERNELD.replace(
                    'mod = get_kernel(REPO, version=1, policy="error")',
                    "import cProfile, pstats, io\n"
                    "pr = cProfile.Profile(time.process_time); pr.enable()\n"
                    'mod = get_kernel(REPO, version=1, policy="error")\n'
                    "pr.disable(); s = io.StringIO()\n"
                    "ps = pstats.Stats(pr, stream=s); ps.sort_stats('tottime').print_stats(TOP)\n"
                    "ps.sort_stats('cumulative').print_stats(TOP)\n"
                    "sys.stderr.write(s.getvalue())",
                ).replace("TOP", str(a.top))
                _, text = run_child(child(prof, KERNELD_SETUP, REPO=REPO), rpc_env)
                lines += ["", "cProfile of the RPC path's call:", "", "```", text.strip(), "```"]
            print("\n".join(lines))
    finally:
        if echo is not None:
            echo.communicate("", timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(results: dict[str, list[dict[str, Any]]], runs: int) -> list[str]:
    names = list(results)
    base = results[names[0]]
    rows = []
    for name, docs in results.items():
        cpu = [d["cpu_ms"] for d in docs]
        diff = [d["cpu_ms"] - b["cpu_ms"] for d, b in zip(docs, base, strict=True)]
        rows.append(
            (
                name,
                fmt_stat(cpu, 1),
                fmt_stat([d["wall_ms"] for d in docs], 1),
                fmt_stat([float(d["modules"]) for d in docs], 0),
                "" if name == names[0] else fmt_stat(diff, 1, " ms"),
            )
        )
    parts = [
        (what, fmt_stat([d[key] for d in results[names[1]]], 1))
        for what, key in (
            ("`import grpc` + resolve_pb2", "import_ms"),
            ("channel + one unary call + close", "call_ms"),
            ("importlib of the variant folder", "kernel_ms"),
        )
    ]
    over = [b["cpu_ms"] - f["cpu_ms"] for b, f in zip(base, results[names[1]], strict=True)]
    return [
        f"CPU ms (`time.process_time`) of the timed call in fresh processes after `import torch`; "
        f"median (min-max) of {runs} rounds, each round every row once, in turn.",
        "",
        *table(
            ["row", "CPU ms", "wall ms", "modules imported", f"CPU - {names[0]} (paired)"], rows
        ),
        "",
        *table(["floor part", "CPU ms"], parts),
        "",
        f"kerneld RPC path - floor, CPU (paired median): {median(over):.1f} ms",
    ]


if __name__ == "__main__":
    sys.exit(main())
