"""Transformers 5.25 warm start through the start-up hook, against plain Transformers and against
`kernels` 0.19.1 from a warm HF cache (issue 40, Deliver 6).

    .venv/bin/python -m bench.transformers_start [--runs 5] [--families llama]

One clean venv with `transformers==5.25.0` (kernels 0.19.1, what it requires) and kerneld-client
(tests/hubapi/venvs.py); the Hub test server serving stand-ins of the repos Transformers maps
RMSNorm, SiLU and rotary to (tests/integrations/transformers_hub.py); one daemon with a metrics
socket. Each timed job is a fresh process, `python -m tests.integrations._tf_models_child`, which
loads tiny random models with `use_kernels` at its default (on), Transformers' GPU mapping
registered for `cpu` too, and runs one forward; the figure is process start (the parent's clock
before it spawns the job) to every model loaded and its first forward done. Rows, interleaved in
each run so that all three see the same machine load:

- **hook**: `KERNELD_HOOK_KERNELS=1`, the daemon's store warm (the published index answers);
- **plain**: `USE_HUB_KERNELS=0` (Transformers loads no kernel; its mapping is not registered);
- **kernels**: the hook off, `kernels` 0.19.1 itself, `HF_ENDPOINT` = the Hub test server, its
  HF cache warm.

One untimed warm-up job per row first (it makes the models, fills the store and the HF cache).
Per job: the Hub requests the server counted, and the daemon's Resolve RPCs (the delta of
`kerneld_resolves_total` on its metrics socket), and whether the job imported grpc at all.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, base_env, fmt_count, fmt_stat, kernels_env, log, median, table
from bench.scenario import DAEMON_CONFIG
from examples.kernels.build import build_examples
from tests.daemon.rpc import http_get_unix
from tests.hubapi.venvs import CLIENT_REQUIREMENT, make_venv
from tests.integrations.transformers_hub import COMMUNITY, build_transformers_hub
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer

HOOK = "Transformers 5.25 + hook (index)"
PLAIN = "Transformers 5.25, USE_HUB_KERNELS=0"
KERNELS = "Transformers 5.25 + kernels 0.19.1, warm HF cache"
ROWS = (HOOK, PLAIN, KERNELS)
KINDS = ("RMSNorm", "SiLU", "rotary_pos_emb")


def resolves(metrics: Path) -> float:
    """The daemon's Resolve RPCs so far, every result label summed."""
    text = http_get_unix(metrics)
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("kerneld_resolves_total")
    )


def job(python: Path, args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    started = time.time()
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "tests.integrations._tf_models_child",
            json.dumps({**args, "started": started}),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"job failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def check(name: str, out: dict[str, Any], *, warm: bool) -> None:
    """A row measures what it says: kernels on every mapped layer, or on none."""
    for family, model in out["models"].items():
        for kind in KINDS:
            layer = model["layers"][kind]
            want = 0 if name == PLAIN else layer["count"]
            if layer["kernelized"] != want or layer["count"] == 0:
                raise RuntimeError(f"{name}: {family} {kind}: {layer}\n{out['stderr'][-2000:]}")
    if warm and name == HOOK and out["kerneld_sources"] != ["index"]:
        raise RuntimeError(f"{name}: loaded from {out['kerneld_sources']}, not the index")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transformers_start")
    parser.add_argument("--runs", type=int, default=5, help="timed jobs per row")
    parser.add_argument("--families", default="llama", help="llama,qwen2,mixtral,qwen3_moe")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    work = Path(tempfile.mkdtemp(prefix="kerneld-tf-bench-"))
    try:
        built = build_examples()
        root = build_transformers_hub(work / "hub", built)
        t0 = time.perf_counter()
        python = make_venv(
            work / "venvs", ["transformers==5.25.0", CLIENT_REQUIREMENT], name="tf-hook"
        )
        log(f"venv ready in {time.perf_counter() - t0:.0f} s")
        rows: dict[str, dict[str, list[float]]] = {n: {"s": [], "hub": [], "rpc": []} for n in ROWS}
        grpc_imported: dict[str, set[bool]] = {n: set() for n in ROWS}
        with HubServer(root, trusted_orgs={COMMUNITY: True}) as server:
            sockets = daemon_dir("kd-tfb-")  # a folder the unprivileged daemon may write
            metrics = sockets / "metrics.sock"
            config = {**DAEMON_CONFIG, "metrics": {"socket": str(metrics)}}
            daemon = DaemonProcess(work / "daemon", hub_endpoint=server.url, config=config)
            daemon.start()
            try:
                base = {**base_env(work / "home"), "PYTHONPATH": str(ROOT)}
                (work / "home").mkdir(exist_ok=True)
                envs = {
                    HOOK: {
                        **kernels_env(base, server.url, work / "hf-hook"),
                        "KERNELD_HOOK_KERNELS": "1",
                        "KERNELD_SOCKET": str(daemon.user_socket),
                    },
                    PLAIN: {
                        **kernels_env(base, server.url, work / "hf-plain"),
                        "USE_HUB_KERNELS": "0",
                    },
                    KERNELS: kernels_env(base, server.url, work / "hf-kernels"),
                }
                common = {"models": str(work / "models"), "families": families, "reference": False}
                for run in range(args.runs + 1):
                    for name in ROWS:
                        spec = {**common, "simulate_gpu": name != PLAIN}
                        server.reset_counts()
                        before = resolves(metrics)
                        out = job(python, spec, envs[name])
                        check(name, out, warm=run > 0)
                        if run == 0:
                            continue  # the warm-up
                        rows[name]["s"].append(out["start_to_forward_s"])
                        rows[name]["hub"].append(float(server.total()))
                        rows[name]["rpc"].append(resolves(metrics) - before)
                        grpc_imported[name].add(bool(out["grpc"]))
                        log(f"run {run} {name}: {out['start_to_forward_s']:.2f} s")
            finally:
                daemon.close()
                shutil.rmtree(sockets, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    plain = median(rows[PLAIN]["s"])
    body = [
        [
            name,
            fmt_stat(rows[name]["s"], 2),
            f"{median(rows[name]['s']) / plain:.2f}x",
            fmt_count(rows[name]["hub"]),
            fmt_count(rows[name]["rpc"]),
            "/".join(sorted(str(v).lower() for v in grpc_imported[name])),
        ]
        for name in ROWS
    ]
    print(
        "\n".join(
            table(
                [
                    "job",
                    "process start to model loaded + first forward, s",
                    "vs plain",
                    "Hub requests",
                    "daemon Resolve RPCs",
                    "grpc imported",
                ],
                body,
            )
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
