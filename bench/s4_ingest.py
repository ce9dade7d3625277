"""Scenarios 4 and 5: ingest of a large variant, and the footprint of five revisions.

4. A synthetic `torch-universal` variant of `--ingest-mib` MiB (five LFS files of 1/2, 1/4, 1/8,
   1/16 and the rest, plus `__init__.py` and a `metadata.json` whose digest covers them) is
   served by the same local Hub server. Per run, each on a fresh store/cache and after `sync`:
   kerneld prefetch (Admin.Prefetch on a fresh daemon: download, sha256 inline, write, fsync,
   publish, metadata digest check) vs `huggingface_hub.snapshot_download` of the same files
   (a fresh process; no hashing, no fsync) vs plain `hashlib.sha256` over the same bytes (read
   from the page cache): the floor of any verified ingest.
5. Five revisions (branches r1..r5) of a `--revision-mib` MiB variant that share four of six
   files (one large file and `__init__.py` change per revision): kerneld prefetches all five
   into one store, `snapshot_download` fetches all five into one HF cache; bytes on disk of
   each (each inode once) vs the sum of the five variants' sizes. Also here: the import times
   (from scenario 1) and the daemon's RSS (from scenarios 3 and 6).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import MIB, disk_bytes, fmt_stat, log, mib, ratios, table
from bench.hubrepos import LfsFile, variant_files, write_hub_repo
from bench.scenario import DAEMON_CONFIG, Ctx, Section
from examples.kernels.specs import ORG
from tests.support.daemon import DaemonProcess

INGEST_REPO = f"{ORG}/bench-ingest"
REVS_REPO = f"{ORG}/bench-revisions"
CHUNK = 8 << 20
INGEST_CONFIG: dict[str, dict[str, Any]] = {
    **DAEMON_CONFIG,
    "fetch": {"attempts": 4, "timeout": "120s"},
}

HF_SNAPSHOT = """
import json, sys, time
from huggingface_hub import snapshot_download
args = json.loads(sys.argv[1])
out = []
for rev in args["revisions"]:
    t = time.perf_counter()
    snapshot_download(args["repo"], repo_type="kernel", revision=rev, cache_dir=args["cache"],
                      endpoint=args["url"])
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def chunked(size: int, seed: bytes) -> Callable[[Any], None]:
    """Writes `size` bytes of distinct 8 MiB chunks (no GiB of randomness needed)."""
    base = hashlib.sha256(seed).digest() * (CHUNK // 32)

    def write(f: Any) -> None:
        left, n = size, 0
        while left > 0:
            take = min(CHUNK, left)
            n += 1
            f.write(n.to_bytes(8, "little") + seed[:8].ljust(8, b"\0") + base[16:take])
            left -= take

    return write


def lfs_digest(spec: LfsFile) -> str:
    h = hashlib.sha256()

    class Sink:
        def write(self, data: bytes) -> None:
            h.update(data)

    spec.write(Sink())
    return base64.b64encode(h.digest()).decode()


def big_variant(total: int, tag: str, shared: dict[str, LfsFile] | None = None) -> dict[str, Any]:
    """Files of a `torch-universal` variant: `shared` LFS files plus new ones up to `total`."""
    big = dict(shared or {})
    if shared is None:
        sizes = [total // 2, total // 4, total // 8, total // 16]
        sizes.append(total - sum(sizes))
        for i, size in enumerate(sizes):
            big[f"_data_{i}.abi3.so"] = LfsFile(size, chunked(size, f"{tag}-{i}".encode()))
    digests = {name: lfs_digest(spec) for name, spec in big.items()}
    init = f'"""Synthetic benchmark variant {tag}."""\n\nREVISION = {tag!r}\n'.encode()
    return variant_files(
        "torch-universal",
        {"__init__.py": init},
        big,
        module_id=f"_bench_{tag.replace('-', '_')}",
        name="bench",
        digests=digests,
    )


def prefetch(daemon: DaemonProcess, repo: str, revisions: Sequence[str]) -> float:
    from kerneld_client.proto import kerneld_pb2 as pb

    req = pb.PrefetchRequest(
        kernels=[pb.KernelRef(repo_id=repo, revision=r) for r in revisions],
        variants=["torch-universal"],
    )
    ok = -1
    with daemon.admin() as admin:
        t0 = time.perf_counter()
        for ev in admin.Prefetch(req, timeout=1800):
            if ev.kind == pb.PrefetchEvent.KERNEL_FAILED:
                raise RuntimeError(f"prefetch failed: {ev.error}")
            if ev.kind == pb.PrefetchEvent.FINISHED:
                ok = ev.kernels_ok
        seconds = time.perf_counter() - t0
    if ok != len(revisions):
        raise RuntimeError(f"prefetch finished {ok} of {len(revisions)} kernels")
    return seconds


def snapshot(ctx: Ctx, repo: str, revisions: Sequence[str], cache: Path) -> list[float]:
    env = {
        **ctx.base_env(),
        "HF_HOME": str(cache.parent / "hf-home"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    arg = json.dumps(
        {"repo": repo, "revisions": list(revisions), "cache": str(cache), "url": ctx.server.url}
    )
    proc = subprocess.run(
        [sys.executable, "-c", HF_SNAPSHOT, arg],
        env=env,
        cwd=ctx.work,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"snapshot_download failed:\n{proc.stderr[-3000:]}")
    times: list[float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return times


def hash_files(paths: Sequence[Path]) -> float:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    t0 = time.perf_counter()
    for path in paths:
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    return time.perf_counter() - t0


def settle() -> None:
    """Write back what earlier steps left dirty, so no step pays for another's writes."""
    os.sync()
    time.sleep(0.5)


def run_ingest(ctx: Ctx) -> Section:
    a = ctx.args
    work = ctx.work / "s4"
    total = a.ingest_mib * MIB
    t0 = time.perf_counter()
    (commit,) = write_hub_repo(ctx.hub_root, INGEST_REPO, [(("main",), big_variant(total, "ing"))])
    objects = sorted(
        (ctx.hub_root / "kernels" / INGEST_REPO / ".git" / "lfs" / "objects").rglob("*")
    )
    objects = [p for p in objects if p.is_file()]
    size = sum(p.stat().st_size for p in objects)
    log(f"ingest: wrote the {a.ingest_mib} MiB repo in {time.perf_counter() - t0:.1f} s")
    rows: dict[str, list[float]] = {"kerneld": [], "hf": [], "sha": []}
    served: list[int] = []
    for r in range(a.ingest_runs):
        run_dir = work / f"run{r}"
        settle()
        rows["sha"].append(hash_files(objects))
        with DaemonProcess(
            run_dir / "daemon", hub_endpoint=ctx.server.url, config=INGEST_CONFIG
        ) as daemon:
            settle()
            ctx.server.reset_counts()
            rows["kerneld"].append(prefetch(daemon, INGEST_REPO, [commit]))
            served.append(ctx.server.total_bytes())
        shutil.rmtree(run_dir / "daemon", ignore_errors=True)
        settle()
        rows["hf"].append(snapshot(ctx, INGEST_REPO, [commit], run_dir / "hf")[0])
        shutil.rmtree(run_dir, ignore_errors=True)
        log(
            f"ingest run {r + 1}/{a.ingest_runs}: kerneld {rows['kerneld'][-1]:.2f} s, "
            f"snapshot_download {rows['hf'][-1]:.2f} s, sha256 {rows['sha'][-1]:.2f} s"
        )
    shutil.rmtree(ctx.hub_root / "kernels" / INGEST_REPO, ignore_errors=True)

    def rate(times: list[float]) -> list[float]:
        return [size / MIB / t for t in times]

    sec = Section("s4", "4. Ingest of a large variant from the local Hub server")
    sec.settings = f"{a.ingest_mib} MiB variant; {a.ingest_runs} run(s)"
    sec.lines = [
        f"A `torch-universal` variant of {a.ingest_mib} MiB (five LFS files, plus `__init__.py` "
        "and a `metadata.json` with the digest of every file) on the same local Hub server. "
        "Each run on a fresh store / cache, after `sync`: kerneld = `Admin.Prefetch` to a "
        "fresh daemon (download, sha256 inline, write + fsync, publish, metadata digest check; "
        "client-side time until the FINISHED event); `snapshot_download` = huggingface_hub in a "
        "fresh process (download only: no hash, no fsync); sha256 = plain `hashlib.sha256` "
        "over the same bytes read from the page cache. Median (min-max) of "
        f"{a.ingest_runs} run(s); ratios paired within a run. The Hub served "
        f"{fmt_stat([b / MIB for b in served], 1)} MiB to kerneld per run.",
        "",
        *table(
            ["what", "seconds", "MiB/s"],
            [
                (
                    "kerneld prefetch (verified, durable)",
                    fmt_stat(rows["kerneld"]),
                    fmt_stat(rate(rows["kerneld"]), 0),
                ),
                (
                    "huggingface_hub.snapshot_download",
                    fmt_stat(rows["hf"]),
                    fmt_stat(rate(rows["hf"]), 0),
                ),
                (
                    "plain hashlib.sha256 over the bytes",
                    fmt_stat(rows["sha"]),
                    fmt_stat(rate(rows["sha"]), 0),
                ),
            ],
        ),
        "",
        *table(
            ["ratio (paired)", "value"],
            [
                (
                    "kerneld / snapshot_download (the cost of hashing inline + fsync + publish)",
                    fmt_stat(ratios(rows["kerneld"], rows["hf"]), 2, "x"),
                ),
                ("kerneld / plain sha256", fmt_stat(ratios(rows["kerneld"], rows["sha"]), 2, "x")),
                (
                    "snapshot_download / plain sha256",
                    fmt_stat(ratios(rows["hf"], rows["sha"]), 2, "x"),
                ),
            ],
        ),
    ]
    sec.data = {"rows": rows}
    return sec


def run_footprint(ctx: Ctx) -> Section:
    a = ctx.args
    work = ctx.work / "s5"
    part = a.revision_mib * MIB // 5
    shared = {
        f"_kernel_{i}.abi3.so": LfsFile(part, chunked(part, f"shared-{i}".encode()))
        for i in range(4)
    }
    commits = []
    variant_sizes = []
    for rev in range(1, 6):
        files = dict(shared)
        files["_layers.abi3.so"] = LfsFile(part, chunked(part, f"rev-{rev}".encode()))
        tree = big_variant(0, f"rev-{rev}", shared=files)
        commits.append(((f"r{rev}",) + (("main",) if rev == 5 else ()), tree))
        variant_sizes.append(
            sum(s.size if isinstance(s, LfsFile) else len(s) for s in tree.values())
        )
    write_hub_repo(ctx.hub_root, REVS_REPO, commits)
    revisions = [f"r{rev}" for rev in range(1, 6)]
    with DaemonProcess(
        work / "daemon", hub_endpoint=ctx.server.url, config=INGEST_CONFIG
    ) as daemon:
        prefetch(daemon, REVS_REPO, revisions)
        from kerneld_client.proto import kerneld_pb2 as pb

        with daemon.kernels() as kernels:
            status = kernels.GetStatus(pb.GetStatusRequest(), timeout=60)
        store_index_bytes = status.store_bytes
        store_disk = disk_bytes(daemon.store_root)
    snapshot(ctx, REVS_REPO, revisions, work / "hf")
    hf_disk = disk_bytes(work / "hf")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(ctx.hub_root / "kernels" / REVS_REPO, ignore_errors=True)
    total = sum(variant_sizes)

    sec = Section("s5", "5. Footprint")
    sec.settings = f"5 revisions of a {a.revision_mib} MiB variant"
    sec.lines = [
        f"Five revisions (branches r1..r5) of a {a.revision_mib} MiB `torch-universal` "
        "variant sharing four of its six files (one large file and `__init__.py` change per "
        "revision): kerneld prefetches all five into one store, `snapshot_download` fetches "
        "all five into one HF cache. On disk = allocated blocks under the directory, each "
        "inode once (the store's trees are hard links to its blobs; the HF cache's snapshots "
        "are symlinks to its blobs). One run: sizes do not vary.",
        "",
        *table(
            ["what", "MiB", "of the five variants' sum"],
            [
                ("sum of the five variants' sizes", mib(total), "100%"),
                (
                    "kerneld store on disk (blobs, trees, index, published index)",
                    mib(store_disk),
                    f"{store_disk / total:.0%}",
                ),
                (
                    "kerneld store usage (its index: blobs + copied files)",
                    mib(store_index_bytes),
                    f"{store_index_bytes / total:.0%}",
                ),
                (
                    "HF cache on disk (blobs, snapshots, refs)",
                    mib(hf_disk),
                    f"{hf_disk / total:.0%}",
                ),
            ],
        ),
    ]
    imports: dict[str, list[float]] = ctx.shared.get("imports", {})
    if imports:
        sec.lines += [
            "",
            "Import cost, in the fresh processes of scenario 1 (after `import torch`; median "
            "(min-max) ms):",
            "",
            *table(["import", "ms"], [(k, fmt_stat(v, 1)) for k, v in imports.items()]),
        ]
    rss_rows = []
    if "rss_idle_one_kernel" in ctx.shared:
        rss_rows.append(
            ("idle, one kernel cached (scenario 3)", f"{ctx.shared['rss_idle_one_kernel']:.1f}")
        )
    if "rss_after_rpc" in ctx.shared:
        rss_rows.append(("after scenario 3's Resolve load", f"{ctx.shared['rss_after_rpc']:.1f}"))
    for trees, rss in ctx.shared.get("rss_by_trees", {}).items():
        rss_rows.append((f"idle, {trees:,} trees in the index (scenario 6)", f"{rss:.1f}"))
    if rss_rows:
        sec.lines += ["", "Daemon memory (VmRSS):", "", *table(["daemon state", "MiB"], rss_rows)]
    ratio = store_disk / hf_disk if hf_disk else float("nan")
    sec.data = {"store_vs_hf": ratio}
    return sec
