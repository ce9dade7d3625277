"""Shared pieces of `make bench` (bench/run.py): statistics, machine facts, the test Hub with the
three benchmark kernels, synthetic Hub repos, the fork zygote that starts ranks together, and
the report section type every scenario returns.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.kernels.build import make_hub  # noqa: E402
from examples.kernels.built import BuiltExamples  # noqa: E402
from examples.kernels.specs import ORG  # noqa: E402
from tests.support.hubserver import HubServer  # noqa: E402

MIB = 1 << 20
NOARCH_KERNEL = "bench-noarch"
# The three kernels every rank of the cold start loads: two compiled examples (activation's
# native library is an LFS file) and one pure-PyTorch noarch kernel written by the bench.
COLD_KERNELS = ("activation", "relu2", NOARCH_KERNEL)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "kerneld bench",
    "GIT_AUTHOR_EMAIL": "bench@kerneld.invalid",
    "GIT_COMMITTER_NAME": "kerneld bench",
    "GIT_COMMITTER_EMAIL": "bench@kerneld.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}


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


# --- synthetic Hub repositories --------------------------------------------------------------


@dataclass(frozen=True)
class LfsFile:
    """A file stored through git LFS: the pointer goes into git, the object next to it. `write`
    streams the content into a file object (so 1 GiB never sits in memory)."""

    size: int
    write: Callable[[Any], None]


FileSpec = bytes | LfsFile


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr}")
    return proc.stdout.strip()


def write_lfs_object(git_dir: Path, spec: LfsFile, staging: Path) -> str:
    """Write an LFS object under `<git_dir>/lfs/objects`; returns its pointer text."""
    h = hashlib.sha256()
    staging.parent.mkdir(parents=True, exist_ok=True)

    class Tee:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, data: bytes) -> None:
            h.update(data)
            self.f.write(data)

    with open(staging, "wb") as f:
        spec.write(Tee(f))
    oid = h.hexdigest()
    dest = git_dir / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        staging.unlink()
    else:
        staging.rename(dest)
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {spec.size}\n"


def write_hub_repo(
    hub_root: Path,
    repo_id: str,
    commits: Sequence[tuple[Sequence[str], Mapping[str, FileSpec]]],
) -> list[str]:
    """A Hub-style git repo at `<hub_root>/kernels/<repo_id>`: one commit per entry (each
    replaces the whole tree), the entry's names made branches pointing at it. LFS objects are
    laid out as the test Hub server serves them. Returns the commit shas in order."""
    repo = hub_root / "kernels" / repo_id
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    git_dir = repo / ".git"
    shas = []
    for i, (branches, files) in enumerate(commits):
        for child in repo.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        for rel, spec in files.items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(spec, LfsFile):
                path.write_text(write_lfs_object(git_dir, spec, git_dir / "lfs" / "tmp" / rel))
            else:
                path.write_bytes(spec)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {i}")
        sha = _git(repo, "rev-parse", "HEAD")
        for name in branches:
            if name != "main":
                _git(repo, "branch", "-f", name, sha)
        shas.append(sha)
    return shas


def variant_files(
    variant: str,
    files: Mapping[str, bytes],
    big: Mapping[str, LfsFile] | None = None,
    *,
    module_id: str,
    name: str,
    digests: Mapping[str, str] | None = None,
) -> dict[str, FileSpec]:
    """`build/<variant>/...` with a metadata.json whose digest covers every file: `digests`
    (base64 sha256) must be given for the `big` files."""
    import base64

    digest = {p: base64.b64encode(hashlib.sha256(d).digest()).decode() for p, d in files.items()}
    digest.update(digests or {})
    meta = {
        "id": module_id,
        "name": name,
        "version": 1,
        "license": "Apache-2.0",
        "kernels-minver": "0.17.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": dict(sorted(digest.items()))},
    }
    out: dict[str, FileSpec] = {f"build/{variant}/{p}": d for p, d in files.items()}
    out.update({f"build/{variant}/{p}": s for p, s in (big or {}).items()})
    out[f"build/{variant}/metadata.json"] = (json.dumps(meta, indent=2) + "\n").encode()
    return out


NOARCH_INIT = '''\
"""A small pure-PyTorch kernel written by kerneld's benchmark (noarch, torch-universal)."""

import torch

__version__ = "1.0.0"


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) ** 2
'''


def write_noarch_kernel(hub_root: Path) -> None:
    """The third cold-start kernel: `<ORG>/bench-noarch`, one torch-universal variant (the
    variant both loaders fall back to when no arch build exists), branches main and v1."""
    module_id = "_bench_noarch_0c3a1f2"
    files = {"__init__.py": NOARCH_INIT.encode()}
    tree = variant_files("torch-universal", files, module_id=module_id, name=NOARCH_KERNEL)
    tree["README.md"] = b"---\nlibrary_name: kernels\n---\n\n# bench-noarch\n"
    write_hub_repo(hub_root, f"{ORG}/{NOARCH_KERNEL}", [(("main", "v1"), tree)])


def make_bench_hub(dest: Path, built: BuiltExamples) -> Path:
    """The example repos plus the bench's noarch kernel; returns the Hub root."""
    hub = make_hub(dest, built=built)
    write_noarch_kernel(hub.root)
    return hub.root


# --- the fork zygote -------------------------------------------------------------------------

# One process imports torch once (it costs the same for every loader and would swamp a 2-core
# machine with 64 ranks), then serves jobs read from stdin, one JSON line each. For a job it
# forks a *job zygote* that takes the job's environment and runs the job's setup (imports the
# loader: never in the torch zygote), then forks the N ranks. Each rank applies its own
# environment and `rank_setup`, says it is ready and waits; the job zygote prints "ready" when
# all are, releases them together on the next stdin line, collects one result per rank (ranks
# still running at the deadline are killed and reported as such) and prints them as one JSON
# line. Times are wall-clock (time.time) for cross-process figures, perf_counter for durations.
ZYGOTE = r"""
import json, os, select, signal, sys, time, traceback
import torch

def readline():
    buf = b""
    while not buf.endswith(b"\n"):
        c = os.read(0, 1)
        if not c:
            return None
        buf += c
    return buf.decode()

def say(obj):
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()

def rank(job, i, g, ready_w, go_r, res_w):
    out = {"rank": i}
    try:
        os.environ.update(job["rank_envs"][i] if job["rank_envs"] else {})
        g["RANK"] = i
        exec(job["rank_setup"], g)
        os.write(ready_w, b"r")
        os.read(go_r, 1)
        out["start"] = time.time()
        p0 = time.perf_counter()
        try:
            mods = [g["load"](repo) for repo in job["repos"]]
            assert all(m is not None for m in mods)
            out["ok"] = True
        except BaseException as exc:
            if not job["tolerate"]:
                raise
            out["ok"] = False
            first = (str(exc).splitlines() or [""])[0][:200]
            out["error"] = type(exc).__name__ + (": " + first if first else "")
        out["dur"] = time.perf_counter() - p0
        out["end"] = time.time()
        out["extra"] = eval(job["extra"], g)
    except BaseException:
        out["fatal"] = traceback.format_exc()[-3000:]
        os.write(ready_w, b"e")
    os.write(res_w, (json.dumps(out) + "\n").encode())

def job_zygote(job):
    os.environ.clear()
    os.environ.update(job["env"])
    g = {"__name__": "bench_job"}
    p0 = time.perf_counter()
    exec(job["setup"], g)
    setup_s = time.perf_counter() - p0
    n = job["n"]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pids = {}
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                rank(job, i, g, ready_w, go_r, res_w)
            finally:
                os._exit(0)
        pids[i] = pid
    got = b""
    while len(got) < n:
        got += os.read(ready_r, n - len(got))
    say("ready" if b"e" not in got else "failed")
    readline()
    go = time.time()
    os.write(go_w, b"g" * n)
    deadline = time.monotonic() + job["deadline"] if job["deadline"] else None
    buf = b""
    while buf.count(b"\n") < n:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([res_r], [], [], wait)
        if not ready:
            break
        buf += os.read(res_r, 1 << 20)
    results = [json.loads(line) for line in buf.decode().splitlines()]
    done = {r["rank"] for r in results}
    for i, pid in pids.items():
        if i not in done:
            os.kill(pid, signal.SIGKILL)
            results.append({"rank": i, "ok": False, "error": "still loading at the deadline",
                            "start": go, "end": None, "dur": None, "extra": None})
    for pid in pids.values():
        os.waitpid(pid, 0)
    say({"go": go, "setup_s": setup_s, "setup_extra": g.get("SETUP_EXTRA"),
         "ranks": sorted(results, key=lambda r: r["rank"])})

say("up")
while True:
    line = readline()
    if line is None:
        break
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            job_zygote(job)
        except BaseException:
            say({"crash": traceback.format_exc()[-3000:]})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
"""


@dataclass
class RankResult:
    rank: int
    ok: bool
    start: float
    end: float | None
    dur: float | None
    error: str | None
    extra: Any


@dataclass
class JobResult:
    """One job: N ranks released together at `go`."""

    go: float
    setup_s: float
    setup_extra: Any
    ranks: list[RankResult]
    hub_requests: int = 0
    hub_bytes: int = 0
    hub_kinds: dict[str, int] = field(default_factory=dict)
    hub_statuses: dict[int, int] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        """From the release until the last rank finished (all ranks must have succeeded)."""
        return max(r.end for r in self.ranks if r.end is not None) - self.go

    @property
    def durations(self) -> list[float]:
        return [r.dur for r in self.ranks if r.dur is not None]


FRESH = r"""
import json, os, sys, time
job = json.loads(sys.argv[1])
g = {"__name__": "bench_job"}
p0 = time.perf_counter()
exec(job["setup"], g)
setup_s = time.perf_counter() - p0
out = {"rank": 0, "start": time.time()}
p0 = time.perf_counter()
mods = [g["load"](repo) for repo in job["repos"]]
out["dur"] = time.perf_counter() - p0
out["end"] = time.time()
out["ok"] = all(m is not None for m in mods)
out["extra"] = eval(job["extra"], g)
print(json.dumps({"setup_s": setup_s, "setup_extra": g.get("SETUP_EXTRA"), "rank": out}))
"""


def fresh_job(*, env: Mapping[str, str], setup: str, repos: Sequence[str], extra: str) -> JobResult:
    """One load in a brand-new interpreter (what a training process is), not a fork: a forked
    child pays copy-on-write faults for every object of its parent it touches (3-5x slower
    Python code on the 2-core machine), which says nothing about a real process start."""
    job = {"setup": textwrap.dedent(setup), "repos": list(repos), "extra": extra}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps(job)],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"a fresh load process failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    r = doc["rank"]
    rank = RankResult(0, bool(r["ok"]), r["start"], r["end"], r["dur"], None, r["extra"])
    return JobResult(r["start"], doc["setup_s"], doc["setup_extra"], [rank])


class Zygote:
    """The ZYGOTE process; `job()` runs N ranks released together. With a server, its request
    and byte counters are reset at the release and read when the job ends."""

    def __init__(self, log_path: Path, env: Mapping[str, str]) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        if self._readline() != "up":
            raise RuntimeError(f"the zygote did not start; see {log_path}")

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def job(
        self,
        *,
        env: Mapping[str, str],
        setup: str,
        repos: Sequence[str],
        n: int = 1,
        rank_envs: Sequence[Mapping[str, str]] | None = None,
        rank_setup: str = "",
        extra: str = "None",
        server: HubServer | None = None,
        tolerate: bool = False,
        deadline_s: float | None = None,
        before_go: Callable[[], None] | None = None,
    ) -> JobResult:
        """Run one job; any rank failure raises unless `tolerate` (then it is reported). Ranks
        still loading after `deadline_s` (default: 10 minutes, so nothing hangs) are stopped."""
        job = {
            "env": dict(env),
            "setup": textwrap.dedent(setup),
            "repos": list(repos),
            "n": n,
            "rank_envs": [dict(e) for e in rank_envs] if rank_envs else None,
            "rank_setup": textwrap.dedent(rank_setup),
            "extra": extra,
            "tolerate": tolerate,
            "deadline": deadline_s if deadline_s is not None else 600.0,
        }
        self._send(json.dumps(job))
        ready = self._readline()
        if before_go is not None:
            before_go()
        if server is not None:
            server.reset_counts()
        self._send("go")
        line = self._readline()
        if not line:
            raise RuntimeError(f"the zygote died (rc {self.proc.poll()}); see its log")
        doc = json.loads(line)
        if "crash" in doc:
            raise RuntimeError(f"a job zygote crashed:\n{doc['crash']}")
        fatal = [r["fatal"] for r in doc["ranks"] if "fatal" in r]
        if ready != "ready" or fatal:
            raise RuntimeError(f"{len(fatal)} rank(s) failed to start; the first:\n{fatal[:1]}")
        ranks = [
            RankResult(
                rank=r["rank"],
                ok=bool(r.get("ok")),
                start=r["start"],
                end=r.get("end"),
                dur=r.get("dur"),
                error=r.get("error"),
                extra=r.get("extra"),
            )
            for r in doc["ranks"]
        ]
        if not tolerate and not all(r.ok for r in ranks):
            raise RuntimeError(f"ranks failed: {[r.error for r in ranks if not r.ok][:3]}")
        result = JobResult(doc["go"], doc["setup_s"], doc["setup_extra"], ranks)
        if server is not None:
            result.hub_requests = server.total()
            result.hub_bytes = server.total_bytes()
            result.hub_kinds = dict(server.counts)
            statuses: dict[int, int] = {}
            for rec in server.requests:
                if rec.kind != "agent_harnesses":
                    statuses[rec.status] = statuses.get(rec.status, 0) + 1
            result.hub_statuses = statuses
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# --- the shared context ----------------------------------------------------------------------

# The daemon configuration of every bench daemon: the production thread pool and fetch retries
# (the test defaults retry less), info logging.
DAEMON_CONFIG: dict[str, dict[str, Any]] = {
    "server": {"threads": 16},
    "fetch": {"attempts": 4, "timeout": "10s"},
    "log": {"level": "info"},
}


@dataclass
class Ctx:
    """What every scenario gets: the options, a work directory, the example build, the one
    Hub-compatible server every scenario talks to, and the torch zygote."""

    args: argparse.Namespace
    work: Path
    built: BuiltExamples
    hub_root: Path
    server: HubServer
    zygote: Zygote
    shared: dict[str, Any] = field(default_factory=dict)  # figures one scenario hands another

    @property
    def home(self) -> Path:
        return self.work / "home"

    def base_env(self) -> dict[str, str]:
        return base_env(self.home)


# --- what every scenario returns -------------------------------------------------------------


@dataclass
class Goal:
    text: str
    met: bool | None  # None: not measurable in this run (e.g. scaled down)
    reason: str


@dataclass
class Section:
    """One scenario's part of RESULTS.md."""

    key: str
    title: str
    lines: list[str] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    seconds: float = 0.0
    settings: str = ""
    data: dict[str, Any] = field(default_factory=dict)


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
