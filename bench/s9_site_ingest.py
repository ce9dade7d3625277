"""Scenario 9: ingest of a large variant from the site cache (nginx) at the machine's limit.

Scenario 4 downloads from the Python Hub test server, which is itself the bottleneck. Here the
same kind of `torch-universal` variant (`--site-mib`, a comma-separated list of sizes: the
largest is the headline, the smaller ones show whether memory grows with the file) is served by
nginx running the shipped site-cache template (deploy/site-cache/) on loopback, its cache warmed
by one untimed prefetch, so every timed byte comes from nginx. Per run, each after `sync`:

- `curl | tee | openssl dgst -sha256`, then `sync FILE`: the shell's verified, durable download;
- one Python stream: urllib `read`, `hashlib.sha256`, `write`, `fsync`, one file after the other
  in a fresh process: the floor a verified, durable ingest in Python starts from;
- kerneld: `Admin.Prefetch` to a fresh daemon whose one upstream is the site cache (listing,
  download, sha256 of every byte against the listing's digest, write + fsync, publish, the
  metadata digest check), and its peak RSS (VmHWM) against its RSS when idle.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import MIB, fmt_stat, log, median, ratios, table
from bench.hubrepos import write_hub_repo
from bench.s4_ingest import INGEST_CONFIG, big_variant, prefetch, settle
from bench.scenario import Ctx, Goal, Section
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess
from tests.support.nginx import site_cache

VARIANT = "torch-universal"
#: The issue's goal: kerneld's verified, durable ingest this much faster than one Python stream.
GOAL_SPEEDUP = 1.2
#: "Flat": the largest size's peak RSS growth within this much of the smallest size's.
FLAT_MIB = 16.0

FLOOR = """
import hashlib, json, os, sys, time, urllib.request
files = json.loads(sys.argv[1])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
t = time.perf_counter()
for url, dest, want in files:
    h = hashlib.sha256()
    with opener.open(url) as r, open(dest, "wb") as f:
        while b := r.read(1 << 20):
            h.update(b)
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    if h.hexdigest() != want:
        sys.exit(f"sha256 mismatch: {url}")
seconds = time.perf_counter() - t
# VmHWM, not ru_maxrss: the latter keeps the spawning parent's peak across exec.
status = open("/proc/self/status").read().split("VmHWM:")[1]
print(json.dumps({"seconds": seconds, "maxrss_kib": int(status.split()[0])}))
"""


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def lfs_files(url: str, repo: str, commit: str) -> list[tuple[str, str]]:
    """(path in the variant, sha256) of the variant's LFS files, from the site cache's listing."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=url.rstrip("/"))
    entries = api.list_repo_tree(
        repo, f"build/{VARIANT}", revision=commit, repo_type="kernel", recursive=True
    )
    return [
        (e.path.removeprefix(f"build/{VARIANT}/"), e.lfs.sha256)
        for e in entries
        if isinstance(e, RepoFile) and e.lfs is not None
    ]


def floor(ctx: Ctx, files: list[tuple[str, Path, str]]) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one Python stream over `files` (url, dest, sha256)."""
    arg = json.dumps([(u, str(d), s) for u, d, s in files])
    proc = subprocess.run(
        [sys.executable, "-c", FLOOR, arg],
        env=ctx.base_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the Python floor failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["seconds"], out["maxrss_kib"] / 1024


def shell(ctx: Ctx, files: list[tuple[str, Path, str]]) -> float:
    """Seconds of `curl | tee | openssl dgst -sha256; sync FILE` over `files`, digests checked."""
    script = "set -e -o pipefail\n" + "".join(
        f"curl -sSf --noproxy '*' {shlex.quote(u)} | tee {shlex.quote(str(d))} "
        f"| openssl dgst -sha256 -r\nsync {shlex.quote(str(d))}\n"
        for u, d, _ in files
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["bash", "-c", script],
        env=ctx.base_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"curl | tee | openssl failed: {proc.stderr[-2000:]}")
    got = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    if got != [s for _, _, s in files]:
        raise RuntimeError(f"curl | tee | openssl: sha256 {got} != {[s for *_, s in files]}")
    return seconds


def one_size(ctx: Ctx, mib_size: int) -> dict[str, Any]:
    a = ctx.args
    work = ctx.work / "s9" / str(mib_size)
    repo = f"{ORG}/bench-site-{mib_size}"
    t0 = time.perf_counter()
    (commit,) = write_hub_repo(
        ctx.hub_root, repo, [(("main",), big_variant(mib_size * MIB, f"site-{mib_size}"))]
    )
    log(f"site ingest: wrote the {mib_size} MiB repo in {time.perf_counter() - t0:.1f} s")
    rows: dict[str, list[float]] = {
        "shell": [],
        "floor": [],
        "kerneld": [],
        "floor_rss": [],
        "kerneld_idle": [],
        "kerneld_peak": [],
    }
    hub_bytes: list[int] = []
    nginx = site_cache(ctx.server.url, work / "nginx", cache_max="16g")
    try:
        # The cache warmed, untimed: the listing and every file once through nginx.
        with DaemonProcess(work / "warm", hub_endpoint=nginx.url, config=INGEST_CONFIG) as daemon:
            prefetch(daemon, repo, [commit])
        shutil.rmtree(work / "warm", ignore_errors=True)
        base = f"{nginx.url}kernels/{repo}/resolve/{commit}/build/{VARIANT}/"
        listed = lfs_files(nginx.url, repo, commit)
        for path, _ in listed:  # the URLs as the shell and the floor spell them (the cache's key)
            subprocess.run(
                ["curl", "-sSf", "--noproxy", "*", "-o", "/dev/null", base + path],
                check=True,
                timeout=600,
            )
        for r in range(a.site_runs):
            run_dir = work / f"run{r}"
            (run_dir / "floor").mkdir(parents=True)
            (run_dir / "shell").mkdir(parents=True)
            ctx.server.reset_counts()
            settle()
            seconds, rss = floor(
                ctx, [(base + p, run_dir / "floor" / f"{i}", s) for i, (p, s) in enumerate(listed)]
            )
            rows["floor"].append(seconds)
            rows["floor_rss"].append(rss)
            shutil.rmtree(run_dir / "floor")
            settle()
            rows["shell"].append(
                shell(
                    ctx,
                    [(base + p, run_dir / "shell" / f"{i}", s) for i, (p, s) in enumerate(listed)],
                )
            )
            shutil.rmtree(run_dir / "shell")
            with DaemonProcess(
                run_dir / "daemon", hub_endpoint=nginx.url, config=INGEST_CONFIG
            ) as daemon:
                settle()
                rows["kerneld_idle"].append(vm_kib(daemon.pid, "VmRSS") / 1024)
                rows["kerneld"].append(prefetch(daemon, repo, [commit]))
                rows["kerneld_peak"].append(vm_kib(daemon.pid, "VmHWM") / 1024)
            hub_bytes.append(ctx.server.total_bytes())
            shutil.rmtree(run_dir, ignore_errors=True)
            log(
                f"site ingest {mib_size} MiB run {r + 1}/{a.site_runs}: "
                f"curl|tee|openssl {rows['shell'][-1]:.2f} s, floor {rows['floor'][-1]:.2f} s, "
                f"kerneld {rows['kerneld'][-1]:.2f} s (peak RSS {rows['kerneld_peak'][-1]:.0f} "
                f"MiB, idle {rows['kerneld_idle'][-1]:.0f})"
            )
    finally:
        nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ctx.hub_root / "kernels" / repo, ignore_errors=True)
    return {"mib": mib_size, "rows": rows, "hub_bytes": hub_bytes, "files": len(listed)}


def run(ctx: Ctx) -> Section:
    a = ctx.args
    results = [one_size(ctx, m) for m in a.site_mib]
    sec = Section("s9", "9. Ingest of a large variant from the site cache (nginx) on loopback")
    sizes = ", ".join(f"{m} MiB" for m in a.site_mib)
    sec.settings = f"{sizes} variant(s); {a.site_runs} run(s) each"
    body: list[tuple[str, ...]] = []
    ratio_rows: list[tuple[str, ...]] = []
    for res in results:
        rows, m = res["rows"], res["mib"]

        def rate(times: list[float], m: int = m) -> list[float]:
            return [m / t for t in times]

        for label, key, rss in (
            ("`curl \\| tee FILE \\| openssl dgst -sha256; sync FILE`", "shell", "-"),
            (
                "one Python stream: urllib read, sha256, write, fsync",
                "floor",
                fmt_stat(rows["floor_rss"], 0),
            ),
            (
                "kerneld prefetch (verified, durable, published)",
                "kerneld",
                f"{fmt_stat(rows['kerneld_peak'], 0)} (idle {fmt_stat(rows['kerneld_idle'], 0)})",
            ),
        ):
            body.append((f"{m}", label, fmt_stat(rows[key]), fmt_stat(rate(rows[key]), 0), rss))
        ratio_rows.append(
            (
                f"{m}",
                fmt_stat(ratios(rows["floor"], rows["kerneld"]), 2, "x"),
                fmt_stat(ratios(rows["shell"], rows["kerneld"]), 2, "x"),
                fmt_stat(ratios(rows["floor"], rows["shell"]), 2, "x"),
                fmt_stat([b / MIB for b in res["hub_bytes"]], 1),
            )
        )
    sec.lines = [
        "The same kind of `torch-universal` variant as scenario 4 (five LFS files, plus "
        "`__init__.py` and `metadata.json`), served by nginx running the shipped site-cache "
        "template (deploy/site-cache/) in front of the local Hub server, on loopback, its cache "
        "warmed by one untimed prefetch: every timed byte comes from nginx's cache, none from "
        "the Python server (last column below). Each run after `sync`; the shell and Python "
        "rows fetch the five LFS files one after the other and check each sha256; kerneld = "
        "`Admin.Prefetch` to a fresh daemon whose upstream is the site cache (listing, "
        "download, sha256 of every byte, write + fsync, publish, metadata digest check; "
        "client-side time until FINISHED). Peak RSS: the Python process's VmHWM; the "
        "daemon's VmHWM after the prefetch (its VmRSS before it in brackets). Median (min-max) "
        f"of {a.site_runs} run(s); ratios paired within a run.",
        "",
        *table(["MiB", "what", "seconds", "MiB/s", "peak RSS MiB"], body),
        "",
        *table(
            [
                "MiB",
                "Python floor / kerneld",
                "shell / kerneld",
                "Python floor / shell",
                "Hub server MiB per run",
            ],
            ratio_rows,
        ),
    ]
    big, small = results[-1], results[0]
    speedup = median(ratios(big["rows"]["floor"], big["rows"]["kerneld"]))
    sec.goals.append(
        Goal(
            f"from the site cache, kerneld's verified durable ingest >= {GOAL_SPEEDUP}x one "
            "Python stream (issue 56)",
            speedup >= GOAL_SPEEDUP if big["mib"] >= 512 else None,
            f"{speedup:.2f}x at {big['mib']} MiB (floor {median(big['rows']['floor']):.2f} s, "
            f"kerneld {median(big['rows']['kerneld']):.2f} s)",
        )
    )
    if big is not small:
        grow_big = median(big["rows"]["kerneld_peak"]) - median(big["rows"]["kerneld_idle"])
        grow_small = median(small["rows"]["kerneld_peak"]) - median(small["rows"]["kerneld_idle"])
        sec.goals.append(
            Goal(
                "kerneld's memory flat in the file size (issue 56)",
                grow_big - grow_small <= FLAT_MIB,
                f"peak over idle: {grow_small:.0f} MiB at {small['mib']} MiB, {grow_big:.0f} MiB "
                f"at {big['mib']} MiB",
            )
        )
    sec.data = {str(r["mib"]): r["rows"] for r in results}
    return sec
