"""Shared pieces of `make bench` (bench/run.py): statistics and their formatting, machine facts,
the environments the loaders run in, and the small helpers every scenario uses to report.

The scenarios' other shared parts have their own modules: `scenario.py` (what a scenario gets
and returns), `hubrepos.py` (the Hub repos it loads from) and `zygote.py` (starting ranks).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 1 << 20


# --- statistics and formatting ---------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def fmt_stat(values: Sequence[float], digits: int = 2, unit: str = "") -> str:
    """`median (min-max)`, or the value alone for one run."""
    med = median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}{unit}"
    return f"{med:.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def fmt_count(values: Sequence[float]) -> str:
    med = median(values)
    text = f"{med:g}"
    return text if min(values) == max(values) else f"{text} ({min(values):g}-{max(values):g})"


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] / b[i]: pairs taken in the same run."""
    return [x / y for x, y in zip(a, b, strict=True) if y > 0]


def mib(n: float) -> str:
    return f"{n / MIB:.1f}"


# --- machine facts ---------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for dist in ("torch", "kernels", "huggingface_hub", "grpcio", "protobuf", "kerneld"):
        try:
            out[dist] = version(dist)
        except Exception:  # a missing package is reported, not fatal
            out[dist] = "not installed"
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return float("nan")


def machine_facts() -> dict[str, str]:
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu_model(),
        "ram": f"{ram_gib():.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def disk_bytes(path: Path) -> int:
    """Allocated bytes under `path`, each inode once (hard links counted once, symlinks as
    links)."""
    seen: set[int] = set()
    total = 0
    for dirpath, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            total += st.st_blocks * 512
    return total


def base_env(home: Path) -> dict[str, str]:
    """This process's environment without anything that steers kerneld, the Hub clients or
    bytecode writing, with its own HOME."""
    drop = ("KERNELD_", "HF_", "GRPC_", "LOCAL_KERNELS", "KERNELS_", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")})
    return env


def kernels_env(base: Mapping[str, str], url: str, hf_home: Path) -> dict[str, str]:
    return {
        **base,
        "HF_ENDPOINT": url,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
    }


# --- reporting -------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)
