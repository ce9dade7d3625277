"""The end of a chaos run: invariants (pass/fail, with evidence) and figures.

Invariants, each proven from what the clients, the admin thread, the supervisor and the Hub
recorded, never from the daemon's own word:

- `store verifies clean`: `kerneldctl verify` through the daemon, then offline on the stopped store;
- `imported only published bytes`: every tree a client imported hashes to exactly the files the
  publisher's git repository has for that (repo, commit, variant);
- `never deleted under a holder`: every tree hashed the same after the client held it (while
  GC ran) as when it imported it;
- `answered within the deadline`: every load got its kernel or fell back within the deadline;
  no client hung, crashed or saw an exception that is not one of the typed errors;
- `right kernel, right results`: the kernel is the commit the selector names and computes what
  PyTorch computes; existing kernels never get a "not found" verdict, absent ones never load,
  and no fallback comes from a failed import of a published tree;
- `denies honoured`, `pins honoured`: no load that started under a deny and ended before its
  lift got the kernel; no GC run inside a pin's window removed a pinned tree;
- `the daemon logged no internal error`: no ERROR or CRITICAL line in any of its logs;
- `daemon supervised cleanly`: no crash, every restart ready, every SIGTERM a clean exit in
  time; `kerneldctl` never hung or crashed; the Hub server raised nothing unexpected.
"""

from __future__ import annotations

import platform
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from chaos.catalog import Catalog
from chaos.daemon import AdminLog, Restart

MAX_EVIDENCE = 5
EXISTING_WRONG = ("KernelNotFound", "NoCompatibleVariant", "KernelLoadError", "UntrustedPath")


@dataclass
class Invariant:
    name: str
    ok: bool
    checked: int
    evidence: list[str] = field(default_factory=list)


@dataclass
class RunData:
    """Everything recorded during a run."""

    records: list[dict[str, Any]]
    cat: Catalog
    admin: AdminLog
    restarts: list[Restart]
    supervisor_problems: list[str]
    verify_online: tuple[int, Any]
    verify_offline: tuple[int, Any]
    final_stop_code: int | None
    hub_errors: list[str]
    hub_requests: Counter[str]
    hub_statuses: Counter[int]
    faults_injected: Counter[str]
    phase_seconds: Mapping[str, float]
    file_bytes: Counter[tuple[str, str]]
    daemon_logs: str
    deadline_s: float
    config: dict[str, Any]
    wall_s: float
    phase_timeline: Sequence[tuple[float, str]] = ()
    """(wall-clock start, name) of every fault phase, in order (`FaultPhases.timeline`)."""


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _inv(name: str, checked: int, bad: Iterable[str]) -> Invariant:
    evidence = list(bad)
    return Invariant(
        name,
        not evidence,
        checked,
        evidence[:MAX_EVIDENCE]
        + (
            [f"... and {len(evidence) - MAX_EVIDENCE} more"] if len(evidence) > MAX_EVIDENCE else []
        ),
    )


def _who(r: dict[str, Any]) -> str:
    return f"client {r.get('client')} op {r.get('op')} ({r.get('label')}, {r.get('policy')})"


def invariants(d: RunData) -> list[Invariant]:
    recs = d.records
    out: list[Invariant] = []

    bad = []
    for label, (rc, doc) in (("online", d.verify_online), ("offline", d.verify_offline)):
        if rc != 0:
            problems = doc.get("problems") if isinstance(doc, dict) else doc
            bad.append(f"verify {label}: exit {rc}: {str(problems)[:800]}")
    out.append(_inv("store verifies clean (kerneldctl verify, online and offline)", 2, bad))

    loaded = [r for r in recs if r.get("files") is not None]
    bad = []
    for r in loaded:
        key = Catalog.key(r["repo"], r["commit"], r["variant"])
        want = d.cat.expected.get(key)
        if want is None:
            bad.append(f"{_who(r)}: imported {key}, which the publisher never published")
        elif r["files"] != want:
            diff = sorted(
                p for p in set(want) | set(r["files"]) if want.get(p) != r["files"].get(p)
            )
            bad.append(f"{_who(r)}: {r['path']} differs from {key} in {diff}")
        named = Path(r["path"]).name == str(r["digest"]).removeprefix("sha256:")
        if r.get("source") in ("index", "daemon") and not named:
            bad.append(f"{_who(r)}: tree {r['path']} is not named by digest {r['digest']}")
    out.append(_inv("imported only the publisher's bytes", len(loaded), bad))

    bad = [
        f"{_who(r)}: {r['path']} after holding it {r.get('held_s', 0):.1f}s: "
        + (
            f"gone ({r.get('after_error', 'no such directory')})"
            if r.get("files_after") is None
            else "changed"
        )
        for r in loaded
        if r.get("files_after") != r["files"]
    ]
    out.append(_inv("no tree deleted or changed under a client holding it", len(loaded), bad))

    bad = []
    for r in recs:
        if r["outcome"] not in ("served", "hub", "fallback"):
            bad.append(f"{_who(r)}: {r['outcome']} {r.get('error')}: {r.get('message', '')[:600]}")
        elif float(r["latency"]) > d.deadline_s:
            bad.append(f"{_who(r)}: {r['outcome']} after {r['latency']:.1f}s > {d.deadline_s:g}s")
    out.append(_inv(f"every load served or fell back within {d.deadline_s:g}s", len(recs), bad))

    bad = []
    for r in recs:
        if r.get("compute_error"):
            bad.append(f"{_who(r)}: {r['outcome']} kernel computes wrong: {r['compute_error']}")
        if r["kind"] == "absent":
            if r["outcome"] in ("served", "hub"):
                bad.append(f"{_who(r)}: loaded a kernel that does not exist: {r.get('path')}")
            continue
        if r["outcome"] in ("served", "hub") and r.get("commit") != r.get("commit_wanted"):
            bad.append(f"{_who(r)}: got commit {r.get('commit')}, wanted {r.get('commit_wanted')}")
        if r["outcome"] == "fallback" and any(w in str(r.get("error")) for w in EXISTING_WRONG):
            bad.append(f"{_who(r)}: {r['error']} for an existing kernel: {r.get('message')}")
        if "internal error" in str(r.get("message")):
            bad.append(f"{_who(r)}: the daemon answered an internal error: {r.get('message')}")
    out.append(_inv("right kernel, right results, right verdicts", len(recs), bad))

    bad = []
    checked = 0
    for w in d.admin.denies:
        end = w.end if w.end is not None else float("inf")
        for r in recs:
            if r["repo"] != w.repo or not (w.start < r["t_start"] and r["t_end"] < end):
                continue
            if w.revision != "*" and r.get("commit_wanted") != w.revision:
                continue
            checked += 1
            if r["outcome"] in ("served", "hub"):
                bad.append(f"{_who(r)}: got {r.get('source')} {r.get('path')} under deny {w}")
    out.append(_inv("denies honoured", checked, bad))

    bad = []
    checked = 0
    for op in d.admin.ops:
        if op.command != "gc" or op.rc != 0 or not isinstance(op.doc, dict):
            continue
        for w in d.admin.pins:
            end = w.end if w.end is not None else float("inf")
            if not (w.start < op.t_start and op.t_end < end):
                continue
            checked += 1
            for item in op.doc.get("removed", []):
                if item.get("repo_id") == w.repo and item.get("commit") == w.revision:
                    bad.append(f"gc at {op.t_start:.1f} removed pinned {w.repo}@{w.revision}")
    out.append(_inv("pins honoured by GC", checked, bad))

    lines = d.daemon_logs.splitlines()
    bad = [ln[:900] for ln in lines if " ERROR " in ln or " CRITICAL " in ln]
    out.append(_inv("the daemon logged no internal error", len(lines), bad))

    bad = list(d.supervisor_problems)
    if d.final_stop_code not in (0, None):
        bad.append(f"final SIGTERM: exit code {d.final_stop_code}")
    for op in d.admin.ops:
        if op.rc in (-1, 2) or "Traceback" in op.stderr:
            bad.append(f"kerneldctl {op.command} {op.args}: rc {op.rc}: {op.stderr[-600:]}")
    bad += [f"hub server: {e}" for e in d.hub_errors]
    out.append(
        _inv(
            "daemon supervised cleanly; kerneldctl and the Hub server never broke",
            len(d.restarts) + len(d.admin.ops),
            bad,
        )
    )
    return out


# ------------------------------------------------------------------------------- figures


def _bytes_refetched(d: RunData) -> dict[str, int]:
    """File bytes the Hub served, and how many of them were beyond one copy of each file."""
    total: Counter[str] = Counter()
    seen: dict[str, int] = {}
    for (path, who), n in d.file_bytes.items():
        total[who] += n
        m = re.fullmatch(r"/kernels/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)", path)
        if m is None:
            continue
        repo = f"{unquote(m.group(1))}/{unquote(m.group(2))}"
        rev, rel = unquote(m.group(3)), unquote(m.group(4))
        commit = d.cat.refs.get(repo, {}).get(rev, rev)
        info = d.cat.repo_files.get(Catalog.key(repo, commit), {}).get(rel)
        if info is not None:
            seen[info[0]] = info[1]
    served = sum(total.values())
    distinct = sum(seen.values())
    return {
        "served": served,
        "daemon": total["daemon"],
        "client": total["client"],
        "distinct": distinct,
        "refetched": max(0, served - distinct),
    }


def figures(d: RunData) -> dict[str, Any]:
    recs = d.records
    outcomes = Counter(r["outcome"] for r in recs)
    sources = Counter(r.get("source") for r in recs if r["outcome"] == "served")
    errors = Counter(str(r.get("error")) for r in recs if r["outcome"] not in ("served", "hub"))
    lat = [float(r["latency"]) for r in recs]
    lat_served = [float(r["latency"]) for r in recs if r["outcome"] in ("served", "hub")]
    lat_fb = [float(r["latency"]) for r in recs if r["outcome"] == "fallback"]
    restarts = Counter(r.how for r in d.restarts)
    ready = [r.ready_s for r in d.restarts if r.ready_s is not None]
    admin = Counter(
        f"{op.command} {'ok' if op.rc == 0 else 'daemon down' if op.rc == 3 else f'rc {op.rc}'}"
        for op in d.admin.ops
    )
    gc_ops = [op for op in d.admin.ops if op.command == "gc" and isinstance(op.doc, dict)]
    gc_removed = Counter(
        str(item.get("reason", "")).split(" (")[0]
        for op in gc_ops
        for item in op.doc.get("removed", [])
    )
    deletions = [ln for ln in d.daemon_logs.splitlines() if "gc: deleting tree" in ln]
    return {
        "duration_s": d.config["duration"],
        "wall_s": round(d.wall_s, 1),
        "clients": d.config["clients"],
        "operations": len(recs),
        "ops_per_s": round(len(recs) / max(1.0, float(d.config["duration"])), 2),
        "outcomes": dict(outcomes),
        "served_by": {str(k): v for k, v in sources.items()},
        "fallbacks": outcomes["fallback"],
        "hub_fallback_loads": outcomes["hub"],
        "errors_by_kind": dict(errors.most_common()),
        "latency_s": {
            "p50": round(percentile(lat, 0.5), 3),
            "p99": round(percentile(lat, 0.99), 3),
            "max": round(max(lat, default=0.0), 3),
            "served_p50": round(percentile(lat_served, 0.5), 3),
            "served_p99": round(percentile(lat_served, 0.99), 3),
            "fallback_p50": round(percentile(lat_fb, 0.5), 3),
            "fallback_p99": round(percentile(lat_fb, 0.99), 3),
        },
        "restarts_survived": sum(1 for r in d.restarts if r.ready_s is not None),
        "restarts": dict(restarts),
        "restart_ready_s": {
            "p50": round(percentile(ready, 0.5), 2),
            "max": round(max(ready, default=0.0), 2),
        },
        "hub_requests": sum(d.hub_requests.values()),
        "hub_requests_by_kind": dict(d.hub_requests.most_common()),
        "hub_statuses": {str(k): v for k, v in sorted(d.hub_statuses.items())},
        "faults_injected": dict(d.faults_injected.most_common()),
        "fault_phase_seconds": {k: round(v, 1) for k, v in d.phase_seconds.items()},
        "bytes": _bytes_refetched(d),
        "admin_ops": dict(sorted(admin.items())),
        "gc_runs": len(gc_ops),
        "gc_removed_by_reason": dict(gc_removed),
        "gc_tree_deletions_logged": len(deletions),
        "gc_evictions_logged": sum(1 for ln in deletions if "(evicted" in ln),
        "pins": len(d.admin.pins),
        "denies": len(d.admin.denies),
        "by_phase": by_phase(d),
        "fallback_causes": dict(
            Counter(fallback_cause(r) for r in recs if r["outcome"] == "fallback").most_common()
        ),
    }


def phase_at(timeline: Sequence[tuple[float, str]], t: float) -> str:
    """The fault phase in force at wall-clock `t` (calm before the first one)."""
    name = "calm"
    for start, phase in timeline:
        if start > t:
            break
        name = phase
    return name


def fallback_cause(r: dict[str, Any]) -> str:
    """Why a load fell back, in the words of the report: which part of the chaos caused it,
    or what the daemon answered when no injected cause explains it."""
    first = str(r.get("error", "")).split("+", 1)[0]
    msg = str(r.get("message", ""))
    if first == "DaemonUnavailable":
        return "daemon down (killer)"
    if first == "KernelDenied":
        return "denied (admin churn)"
    if first == "KernelNotFound":
        return "absent kernel (asked on purpose)" if r.get("kind") == "absent" else "not found"
    if first == "KernelUnavailable":
        for needle, cause in (
            ("resource exhausted", "store cap"),
            ("malformed answer", "Hub faults (a corrupted answer)"),
            ("every upstream is unreachable", "Hub faults (retries spent, nothing cached)"),
            ("failed after", "Hub faults (retries spent, nothing cached)"),
            ("does not match the Hub", "Hub faults (`hub` fallback refused corrupted bytes)"),
            ("trusted kernel publisher", "Hub faults (`hub` fallback's publisher check)"),
            ("the Hub could not be used", "Hub faults (`hub` fallback)"),
            ("disappeared", "tree gone before import"),
            ("did not answer in time", "deadline"),
        ):
            if needle in msg:
                return cause
        return "unavailable: " + (re.sub(r"[0-9a-f]{12,}", "…", msg)[:80] or "?")
    return first or str(r.get("outcome"))


def by_phase(d: RunData) -> dict[str, dict[str, Any]]:
    """Per fault phase (the one a load started in): loads, fallbacks, their share and why."""
    out: dict[str, dict[str, Any]] = {}
    for r in d.records:
        if "t_start" not in r:
            continue
        row = out.setdefault(
            phase_at(d.phase_timeline, float(r["t_start"])),
            {"loads": 0, "fallbacks": 0, "causes": Counter()},
        )
        row["loads"] += 1
        if r["outcome"] == "fallback":
            row["fallbacks"] += 1
            row["causes"][fallback_cause(r)] += 1
    for row in out.values():
        row["share"] = round(row["fallbacks"] / row["loads"], 3) if row["loads"] else 0.0
        row["causes"] = dict(row["causes"].most_common())
    return dict(sorted(out.items()))


def _fmt_counter(c: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items()) or "none"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def render_markdown(fig: dict[str, Any], invs: list[Invariant], command: str) -> str:
    lat = fig["latency_s"]
    b = fig["bytes"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {_machine()}.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| duration (wall, incl. setup and checks) | {fig['duration_s']} s ({fig['wall_s']} s) |",
        f"| client processes | {fig['clients']} |",
        f"| operations (one fresh process each) | {fig['operations']} ({fig['ops_per_s']}/s) |",
        f"| outcomes | {_fmt_counter(fig['outcomes'])} |",
        f"| served from | {_fmt_counter(fig['served_by'])} |",
        f"| fallbacks (to PyTorch) | {fig['fallbacks']} ({_fmt_counter(fig['fallback_causes'])}) |",
        f"| loads via the `hub` fallback | {fig['hub_fallback_loads']} |",
        f"| errors by kind (why not served from the store) | "
        f"{_fmt_counter(fig['errors_by_kind'])} |",
        f"| load latency p50 / p99 / max | {lat['p50']} / {lat['p99']} / {lat['max']} s |",
        f"| served p50 / p99 | {lat['served_p50']} / {lat['served_p99']} s |",
        f"| fallback p50 / p99 | {lat['fallback_p50']} / {lat['fallback_p99']} s |",
        f"| daemon restarts survived | {fig['restarts_survived']} "
        f"({_fmt_counter(fig['restarts'])}) |",
        f"| restart to ready p50 / max | {fig['restart_ready_s']['p50']} / "
        f"{fig['restart_ready_s']['max']} s |",
        f"| Hub requests | {fig['hub_requests']} ({_fmt_counter(fig['hub_requests_by_kind'])}) |",
        f"| Hub response statuses | {_fmt_counter(fig['hub_statuses'])} |",
        f"| faults injected | {_fmt_counter(fig['faults_injected'])} |",
        f"| fault phases (s) | {_fmt_counter(fig['fault_phase_seconds'])} |",
        f"| file bytes served by the Hub | {_mib(b['served'])} (daemon {_mib(b['daemon'])}, "
        f"`hub` fallback {_mib(b['client'])}) |",
        f"| bytes re-fetched (beyond one copy of each file) | {_mib(b['refetched'])} |",
        f"| GC runs (kerneldctl) / trees removed | {fig['gc_runs']} / "
        f"{_fmt_counter(fig['gc_removed_by_reason'])} |",
        f"| tree deletions in the daemon log (incl. GC on reservation) | "
        f"{fig['gc_tree_deletions_logged']} ({fig['gc_evictions_logged']} LRU evictions) |",
        f"| kerneldctl commands | {_fmt_counter(fig['admin_ops'])} |",
        f"| pins / denies in force at some point | {fig['pins']} / {fig['denies']} |",
        "",
        "| fault phase (a load counts in the phase it started in) | loads | fell back | share "
        "| why |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {name} | {row['loads']} | {row['fallbacks']} | {row['share']:.0%} | "
            f"{_fmt_counter(row['causes'])} |"
            for name, row in fig["by_phase"].items()
        ),
        "",
        "| invariant | checked | result |",
        "| --- | --- | --- |",
    ]
    for inv in invs:
        lines.append(f"| {inv.name} | {inv.checked} | {'PASS' if inv.ok else 'FAIL'} |")
    failed = [inv for inv in invs if not inv.ok]
    for inv in failed:
        lines += ["", f"FAIL {inv.name}:", *[f"- {e}" for e in inv.evidence]]
    return "\n".join(lines) + "\n"


def _machine() -> str:
    import os

    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f", {int(line.split()[1]) / (1 << 20):.0f} GiB RAM"
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores{mem}, {platform.machine()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
