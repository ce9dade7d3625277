"""Starting the loading processes of a scenario: N ranks forked from one process that imported
torch once and released together (`Zygote`), or one brand-new interpreter (`fresh_job`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ROOT
from tests.support.hubserver import HubServer

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
import gc, json, os, sys, time
job = json.loads(sys.argv[1])
g = {"__name__": "bench_job"}
p0 = time.perf_counter()
exec(job["setup"], g)
setup_s = time.perf_counter() - p0
gc.freeze()  # the setup's objects (torch's): a collection they owe must not land in one call
out = {"rank": 0, "start": time.time()}
p0 = time.perf_counter()
mods = [g["load"](repo) for repo in job["repos"]]
out["dur"] = time.perf_counter() - p0
out["end"] = time.time()
out["ok"] = all(m is not None for m in mods)
out["extra"] = eval(job["extra"], g)
print(json.dumps({"setup_s": setup_s, "setup_extra": g.get("SETUP_EXTRA"), "rank": out}))
"""


def run_fresh(code: str, env: Mapping[str, str], *argv: str) -> dict[str, Any]:
    """Run `code` in a brand-new interpreter; its last line of output is one JSON object."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"a fresh process failed:\n{proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def fresh_job(*, env: Mapping[str, str], setup: str, repos: Sequence[str], extra: str) -> JobResult:
    """One load in a brand-new interpreter (what a training process is), not a fork: a forked
    child pays copy-on-write faults for every object of its parent it touches (3-5x slower
    Python code on the 2-core machine), which says nothing about a real process start.

    The setup's objects are frozen (`gc.freeze()`) before the timed load: importing torch
    leaves a collection due (a generation-1 pass over its objects, about 0.9 ms here), and
    whether it fell inside the call depended on how many objects the loader's own imports had
    allocated, not on the call: one more module moved a whole collection into a loader's figure.
    Frozen objects are never traversed, so a collection inside the call costs what the call
    allocated. (`gc.collect()` instead would leave every loader's call 0.5 ms slower on cold CPU
    caches.)"""
    job = {"setup": textwrap.dedent(setup), "repos": list(repos), "extra": extra}
    doc = run_fresh(FRESH, env, json.dumps(job))
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
