"""Store benchmark: ingest throughput vs plain hashlib.sha256, and dedupe across revisions.

Run from the repository root:

    .venv/bin/python bench/store_bench.py [--size-mib 1024] [--dir DIR] [--out FILE.md]

1. A synthetic variant of several files (default 1 GiB in total) is hashed with plain
   ``hashlib.sha256`` (the floor: one pass over the same in-memory chunks), then ingested into a
   fresh store (hash + write + fsync + rename + index row) on the benchmark directory's file
   system, and again on tmpfs (/dev/shm) to separate the disk's write-back speed from the
   store's own overhead. Ratio = hashlib time / ingest time (goal >= 0.9).
2. Five revisions of a variant that share most files are published; the bytes the store holds
   are compared with the sum of the five variants' sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kerneld.store import Store, TreeFile
from kerneld.store.blobs import Expected

NOTES = [
    "## Reading the figures",
    "",
    "- On disk the ingest is bound by the device's write-back (plain `write` + `fsync` of the",
    "  same bytes measures 350-530 MiB/s here), so the 0.9 goal is out of reach with durable",
    "  writes on this disk; nothing is skipped to reach it.",
    "- On tmpfs the remaining gap is the copy into page cache: the writer thread overlaps it",
    "  with hashing (a single 512 MiB blob measured 1444 vs 1465 MiB/s, ratio 0.99, on an idle",
    "  machine), but on 2 shared cores the figures drift between runs (see hashlib's own spread).",
    "- sha256 + git sha1 hashes twice in the caller's thread: about half the sha256-only rate.",
    "",
]

CHUNK = 8 << 20
MIB = 1 << 20


def make_files(total: int) -> dict[str, list[bytes]]:
    """Several files (1/2, 1/4, 1/8, 1/16, rest) as lists of distinct 8 MiB chunks."""
    base = os.urandom(CHUNK)
    sizes = [total // 2, total // 4, total // 8, total // 16]
    sizes.append(total - sum(sizes))
    files: dict[str, list[bytes]] = {}
    n = 0
    for i, size in enumerate(sizes):
        chunks = []
        left = size
        while left > 0:
            take = min(CHUNK, left)
            n += 1
            # distinct content per chunk without generating 1 GiB of randomness
            chunks.append(n.to_bytes(8, "little") + base[8:take])
            left -= take
        files[f"_kernel_cuda_{i}.abi3.so"] = chunks
    return files


def bench_hashlib(files: dict[str, list[bytes]]) -> tuple[float, dict[str, str]]:
    digests = {}
    t0 = time.perf_counter()
    for name, chunks in files.items():
        h = hashlib.sha256()
        for c in chunks:
            h.update(c)
        digests[name] = h.hexdigest()
    return time.perf_counter() - t0, digests


def bench_ingest(root: Path, files: dict[str, list[bytes]], digests: dict[str, str]) -> float:
    with Store.open(root) as store:
        t0 = time.perf_counter()
        for name, chunks in files.items():
            exp = Expected(sum(len(c) for c in chunks), sha256=digests[name])
            with store.open_writer(exp) as w:
                for c in chunks:
                    w.write(c)
                w.commit()
        return time.perf_counter() - t0


def bench_ingest_git(root: Path, files: dict[str, list[bytes]], digests: dict[str, str]) -> float:
    expected = {}
    for name, chunks in files.items():
        size = sum(len(c) for c in chunks)
        h = hashlib.sha1(b"blob %d\x00" % size)
        for c in chunks:
            h.update(c)
        expected[name] = Expected(size, sha256=digests[name], git_sha1=h.hexdigest())
    with Store.open(root) as store:
        t0 = time.perf_counter()
        for name, chunks in files.items():
            with store.open_writer(expected[name]) as w:
                for c in chunks:
                    w.write(c)
                w.commit()
        return time.perf_counter() - t0


def disk_bytes(path: Path) -> int:
    """Allocated bytes under path, each inode once (hard links are not double-counted)."""
    seen = set()
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            total += st.st_blocks * 512
    return total


def bench_revisions(root: Path, variant_mib: int) -> dict[str, int]:
    import base64
    import json

    rng = os.urandom
    shared = {f"_kernel_{i}.abi3.so": rng(variant_mib * MIB // 5) for i in range(4)}
    total_sizes = 0
    with Store.open(root) as store:
        for rev in range(5):
            files = dict(shared)
            files["_ops.py"] = f"revision = {rev}\n".encode()
            files["layers.py"] = rng(variant_mib * MIB // 5)  # one file changes per revision
            files["metadata.json"] = json.dumps(
                {
                    "id": f"_kernel_{rev}",
                    "digest": {
                        "algorithm": "sha256",
                        "files": {
                            p: base64.b64encode(hashlib.sha256(b).digest()).decode()
                            for p, b in files.items()
                        },
                    },
                }
            ).encode()
            tf = []
            for path, data in files.items():
                info = store.ingest(data, size=len(data), sha256=hashlib.sha256(data).hexdigest())
                tf.append(TreeFile(path, info.sha256, len(data)))
            store.publish_tree("bench/kernel", f"{rev:040x}", "torch-cpu", tf)
            total_sizes += sum(len(b) for b in files.values())
        used = store.usage().bytes_used
    return {"sum_of_sizes": total_sizes, "store_bytes": used, "allocated": disk_bytes(root / "v1")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--revision-mib", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where to put the disk store (default: bench/out)")
    ap.add_argument("--out", default="bench/results/store.md")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    here = Path(__file__).resolve().parent
    disk_dir = Path(args.dir) if args.dir else here / "out"
    disk_dir.mkdir(parents=True, exist_ok=True)
    total = args.size_mib * MIB
    files = make_files(total)
    rows = []
    fs_list = [("disk", disk_dir)]
    if os.path.isdir("/dev/shm"):
        fs_list.append(("tmpfs", Path("/dev/shm")))
    hash_times = []
    for label, base in fs_list:
        for attempt in range(args.repeat):
            # Each ingest is compared with a hashlib pass measured right before it, after the
            # previous run's write-back has settled (the machine's speed drifts).
            os.sync()
            time.sleep(1)
            t_hash, digests = bench_hashlib(files)
            hash_times.append(t_hash)
            tmp = Path(tempfile.mkdtemp(prefix="kerneld-bench-", dir=base))
            try:
                t_ing = bench_ingest(tmp / "s1", files, digests)
                os.sync()
                t_git = bench_ingest_git(tmp / "s2", files, digests)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            rows.append((label, attempt + 1, t_hash, t_ing, t_git))
            print(
                f"{label}#{attempt + 1}: hashlib {total / t_hash / MIB:.0f} MiB/s, ingest "
                f"{total / t_ing / MIB:.0f} MiB/s, ratio {t_hash / t_ing:.2f}"
            )
    t_hash = min(hash_times)
    tmp = Path(tempfile.mkdtemp(prefix="kerneld-bench-", dir=disk_dir))
    try:
        rev = bench_revisions(tmp / "s", args.revision_mib)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    hash_rate = total / t_hash / MIB
    lines = [
        "# Store benchmark",
        "",
        f"Command: `.venv/bin/python bench/store_bench.py --size-mib {args.size_mib} "
        f"--revision-mib {args.revision_mib} --repeat {args.repeat}`",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}.",
        "",
        f"## Ingest of a {args.size_mib} MiB variant ({len(files)} files)",
        "",
        "Ingest = hash (sha256) + write + fsync + rename + fsync(dir) + index row, from in-memory",
        "8 MiB chunks. Baseline = plain `hashlib.sha256` over the same chunks. Ratio = baseline",
        "time / ingest time (goal >= 0.9).",
        "",
        f"plain hashlib.sha256, best run: {hash_rate:.0f} MiB/s ({t_hash:.2f} s)",
        "",
        "| file system | run | hashlib MiB/s | ingest MiB/s | ratio | ingest, sha256 + git sha1 "
        "MiB/s | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, attempt, t_h, t_ing, t_git in rows:
        lines.append(
            f"| {label} | {attempt} | {total / t_h / MIB:.0f} | {total / t_ing / MIB:.0f} | "
            f"{t_h / t_ing:.2f} | {total / t_git / MIB:.0f} | {t_h / t_git:.2f} |"
        )
    lines += [
        "",
        f"## Five revisions sharing most files ({args.revision_mib} MiB variant, 4 of 6 files "
        "shared, one large file changed per revision)",
        "",
        f"- sum of the five variants' sizes: {rev['sum_of_sizes'] / MIB:.1f} MiB",
        f"- store usage (index): {rev['store_bytes'] / MIB:.1f} MiB "
        f"({rev['store_bytes'] / rev['sum_of_sizes']:.0%})",
        f"- allocated on disk under v1/ (each inode once): {rev['allocated'] / MIB:.1f} MiB",
        "",
        *NOTES,
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
