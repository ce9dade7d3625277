"""scripts/gpu-check: the CUDA examples, end to end, on a GPU host, in one command.

Builds activation-cuda and attention-cuda, the attention example's GPU build
(examples/kernels/cuda/build.py: nvcc from the toolkit wheels), checks the archs in each `.so`
against its metadata, writes a mirror directory, starts a real `kerneld --user` on it, and runs
fresh job processes (examples/gpu_probe.py) against it: the variant kerneld chooses and its
import; on a GPU the ops against PyTorch references (attention against torch's
scaled_dot_product_attention) and a warm load through kerneld beside one through `kernels`.
One table at the end.

`--dry-run` runs every CPU-side part on any host: the build, the arch check, the daemon, and the
resolve and import of the CUDA variant with injected facts for a cc 9.0 and a cc 8.0 device
(and a cc 7.5 one, which the archs must refuse). `--python` names the job interpreter: on a GPU
host, a venv with the CUDA torch, kerneld-client and kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from examples.kernels.cuda.build import (
    ATTENTION_REPO_ID,
    CUDA_SPECS,
    build,
    check_archs,
    default_out,
    write_mirror,
)
from examples.kernels.specs import BuildError
from examples.main_job import DemoError, _tool, child_env, kerneld, wait_ready

ROOT = Path(__file__).resolve().parents[1]
#: Facts of a CUDA 13.0 torch 2.13 process on one device of this capability.
FACTS = '{{"torch_version": "2.13", "cxx11_abi": true, "backend": "cu130", "device_capabilities": ["{cap}"]}}'  # noqa: E501
Row = tuple[str, str, str]  # check, detail, verdict


class CheckFailed(RuntimeError):
    """A step of the check failed; the message says which and why."""


def probe(python: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, "-m", "examples.gpu_probe", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        raise CheckFailed(f"gpu_probe {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _resolve_rows(python: str, env: dict[str, str]) -> list[Row]:
    rows: list[Row] = []
    cases = [(None, "9.0", True), (None, "8.0", True), (None, "7.5", False)]
    cases += [(ATTENTION_REPO_ID, "9.0", True), (ATTENTION_REPO_ID, "7.5", False)]
    for repo, cap, expect in cases:
        facts = {**env, "KERNELD_PLATFORM_JSON": FACTS.format(cap=cap)}
        got = probe(python, facts, "resolve", *(("--repo", repo) if repo else ()))
        imported = "imported" in got
        # The device check's reason, without the repo and the hint around it.
        why = got.get("import_error", "").split("on this device: ")[-1][:110]
        result = f"import ok, ops {got.get('ops')}" if imported else f"refused: {why}"
        detail = f"chosen {got['chosen']}; {result}"
        name = f"resolve+import {repo.split('/')[1]}," if repo else "resolve+import,"
        rows.append((f"{name} injected cc {cap}", detail, _verdict(imported == expect)))
    return rows


def _kernelize_rows(python: str, env: dict[str, str]) -> list[Row]:
    """This process's real facts: without a device, kernelize for `cuda` must keep PyTorch."""
    got = probe(python, env, "kernelize")
    if got["cuda_available"]:
        return []  # the GPU rows run the kernel itself
    ok = not got["kernelized"] and len(got["kept"]) == 2 and got["output_unchanged"]
    reasons = "; ".join(sorted(set(got["kept"].values())))[:110]
    detail = f"kept PyTorch, output unchanged: {got['output_unchanged']} ({reasons})"
    return [("kernelize for cuda, no device", detail, _verdict(ok))]


def _verdict(ok: bool) -> str:
    return "ok" if ok else "FAIL"


def _gpu_rows(python: str, env: dict[str, str], build_root: Path, loads: int) -> list[Row]:
    rows: list[Row] = []
    got = probe(python, env, "ops")
    if "error" in got:
        raise CheckFailed(
            f"the GPU part needs a CUDA torch and a device: {got['error']}. On a GPU host, pass "
            "--python with a venv holding the CUDA torch, kerneld-client and kernels; "
            "elsewhere run --dry-run"
        )
    for r in got["rows"]:
        detail = f"{got['device']} (cc {got['capability']}), max abs err {r['max_abs_err']:.2e}"
        against = "torch sdpa" if r["op"].startswith("flash_attn") else "PyTorch"
        rows.append((f"{r['op']} {r['dtype']} vs {against}", detail, _verdict(r["ok"])))
    probe(python, env, "load-kerneld")  # the cold one: the daemon fetches into its store
    timings = {}
    for through in ("kerneld", "kernels"):
        extra = ("--path", str(build_root)) if through == "kernels" else ()
        times = [probe(python, env, f"load-{through}", *extra)["seconds"] for _ in range(loads)]
        timings[through] = statistics.median(times)
        rows.append(
            (
                f"warm load via {through}",
                f"median of {loads}: {timings[through] * 1e3:.1f} ms",
                "ok",
            )
        )
    ratio = timings["kerneld"] / timings["kernels"]
    rows.append(("warm load kerneld / kernels", f"{ratio:.2f}x", "ok"))
    return rows


def _config(work: Path, mirror: Path) -> Path:
    config = work / "kerneld.toml"
    config.write_text(
        "# gpu-check's daemon: user mode, the CUDA example's mirror directory only\n"
        "[[upstream]]\n"
        'name = "cuda-examples"\n'
        'kind = "mirror-dir"\n'
        f'path = "{mirror}"\n\n'
        "[prefetch]\n"
        "on_start = false\n\n"
        "[trust]\n"
        'allow = ["kerneld-examples/*"]\n',
        encoding="utf-8",
    )
    return config


def run_check(work: Path, *, dry_run: bool, python: str, loads: int) -> list[Row]:
    rows: list[Row] = []
    builds = []
    for spec in CUDA_SPECS:
        t = time.monotonic()
        built = build(default_out(spec), spec)
        builds.append(built)
        mib = built.downloaded_bytes / 2**20
        rows.append(
            (
                f"build {spec.name} (nvcc from wheels)",
                f"{time.monotonic() - t:.1f} s, {mib:.1f} MiB downloaded",
                "ok",
            )
        )
        for variant in built.variants:
            declared, found = check_archs(variant.path)
            rows.append(
                (
                    f"archs {spec.name} {variant.variant}",
                    f"metadata {declared}, .so {found}",
                    _verdict(declared == found),
                )
            )
    mirror = work / "mirror"
    commits = write_mirror(builds, mirror)
    store, socket, admin = work / "store", work / "kerneld.sock", work / "admin.sock"
    env = child_env(work, {"KERNELD_SOCKET": str(socket), "KERNELD_ADMIN_SOCKET": str(admin)})
    cmd = [
        *_tool("kerneld", "kerneld.server.main"),
        "--user",
        "--config",
        str(_config(work, mirror)),
        "--store",
        str(store),
        "--socket",
        str(socket),
        "--admin-socket",
        str(admin),
    ]
    log = work / "kerneld.log"
    with kerneld(cmd, env, log) as proc:
        t = time.monotonic()
        wait_ready(proc, socket, log, timeout=60)
        rows.append(
            (
                "kerneld --user on the mirror",
                f"ready in {time.monotonic() - t:.2f} s; "
                + ", ".join(f"{repo}@{commit[:12]}" for repo, commit in commits.items()),
                "ok",
            )
        )
        rows += _resolve_rows(python, env)
        rows += _kernelize_rows(python, env)
        if not dry_run:
            rows += _gpu_rows(python, env, builds[0].root, loads)
    return rows


def print_table(rows: list[Row]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    line = "+".join("-" * (w + 2) for w in widths)
    print(line)
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU-side parts only")
    parser.add_argument("--python", default=sys.executable, help="the jobs' interpreter")
    parser.add_argument("--loads", type=int, default=5, help="warm loads timed per route")
    parser.add_argument("--work", type=Path, help="keep the daemon's files here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        try:
            rows = run_check(work, dry_run=args.dry_run, python=args.python, loads=args.loads)
        except (BuildError, CheckFailed, DemoError, subprocess.TimeoutExpired) as e:
            print(f"gpu-check: {e}", file=sys.stderr)
            return 1
    rows.append(
        (
            "total",
            f"{time.monotonic() - started:.1f} s" + (" (dry run)" if args.dry_run else ""),
            "",
        )
    )
    print_table(rows)
    return 0 if all(r[2] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
