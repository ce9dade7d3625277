"""Run the chaos/soak harness: `python -m chaos [--duration S] [--clients N] ...`.

Setup: the catalog's git repos behind a `ChaosHub`; one real daemon (Hub upstream, a size cap
well under what the clients use so GC really evicts, no minimum age, short leases and ref TTL,
prefetch on start) under the `Supervisor`. Then, all at once for `--duration` seconds: the
client processes, the fault phases, the admin churn and the killer. Then: clients finish their
last operation, the chaos threads stop, faults stop, every deny and pin is lifted, the store is
verified through the daemon, the daemon gets SIGTERM and the store is verified offline; the
figures and invariants are printed (and written as markdown with `--report`). Exit status 0 only
if every invariant holds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import client as chaos_client
from chaos.catalog import EXAMPLES_ORG, SYNTH_ORG, build_catalog
from chaos.checks import Invariant, RunData, figures, invariants, render_markdown
from chaos.daemon import AdminChurn, Killer, Supervisor
from chaos.hub import ChaosHub, FaultPhases
from tests.support.ctl import KERNELDCTL, ctl_env
from tests.support.daemon import DaemonProcess, clean_env

REPO_ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- chaos:begin -->", "<!-- chaos:end -->"


@dataclass
class ChaosConfig:
    """The knobs of one run (the command-line flags); `tests/test_chaos.py` has the CI ones."""

    duration: float = 60.0
    clients: int = 16
    fault_rate: float = 0.15
    """Share of Hub requests that get a fault in the `flaky` phase."""
    fault_period: float = 6.0
    kill_every: float = 15.0
    """Seconds between daemon kills (jittered +-40%; one in five is a SIGTERM)."""
    admin_every: float = 1.5
    gc_every: float = 4.0
    deadline: float = 60.0
    """A load must be served or fall back within this many seconds."""
    fetch_timeout: float = 20.0
    hold: tuple[float, float] = (0.5, 4.0)
    """Seconds a client keeps a loaded kernel (and its tree lock) before re-hashing the tree."""
    long_hold_share: float = 0.15
    long_hold: tuple[float, float] = (8.0, 20.0)
    """A share of loads are held this long (a training job): nobody resolves their tree
    meanwhile, so it becomes the least recently resolved, GC's first candidate, while in use."""
    think: tuple[float, float] = (0.0, 1.0)
    hub_share: float = 0.15
    """Share of loads under KERNELD_FALLBACK=hub (the rest: torch)."""
    synthetic: int = 6
    cap: int | None = None
    """Store size cap in bytes; default: 30% of what the clients' best variants need, so GC
    evicts all the time and trees in use are among its candidates."""
    seed: int = 1
    nice: int = 5
    """Client processes run this much nicer than the daemon (a service outranks batch work)."""
    workdir: Path | None = None
    keep: bool = False


@dataclass
class ChaosResult:
    ok: bool
    figures: dict[str, Any]
    invariants: list[Invariant]
    markdown: str
    workdir: Path
    notes: list[str] = field(default_factory=list)


def daemon_config(cfg: ChaosConfig, cap: int) -> dict[str, Any]:
    """kerneld.toml for the run: a small cap and no minimum age so GC evicts what is not held,
    short leases and TTLs so refs are re-asked of the faulty Hub, prefetch at every start."""
    return {
        "store": {"cap": cap, "gc_min_age": 0, "orphan_grace": "5s", "min_free": 0},
        "resolve": {"ref_ttl": "5s", "negative_ttl": "2s", "lease_ttl": "2s"},
        "fetch": {"attempts": 3, "timeout": "5s"},
        "prefetch": {
            "kernels": [f"{EXAMPLES_ORG}/activation:1", f"{EXAMPLES_ORG}/relu2:2"],
            "on_start": True,
            "interval": "30s",
        },
        "server": {"drain_timeout": "5s", "threads": 16},
        "log": {"level": "info"},
    }


def client_env(work: Path, daemon: DaemonProcess, hub_url: str, cfg: ChaosConfig) -> dict[str, str]:
    """The clients' environment: this daemon and store, the faulty Hub for the `hub` fallback,
    one thread each (2 cores, many processes), nothing of the caller's own setup."""
    home = work / "client-home"
    return clean_env(
        {
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / "cache"),
            "KERNELD_SOCKET": str(daemon.user_socket),
            "KERNELD_STORE": str(daemon.store_root),
            "KERNELD_TIMEOUT": "2",
            "KERNELD_FETCH_TIMEOUT": str(cfg.fetch_timeout),
            "KERNELD_HUB_CACHE": str(work / "hub-cache"),
            "KERNELD_BYTECODE_CACHE": str(work / "bytecode"),
            "HF_ENDPOINT": hub_url,
            "HF_HOME": str(home / "hf"),
            "HF_HUB_DOWNLOAD_TIMEOUT": "5",
            "HF_HUB_ETAG_TIMEOUT": "5",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO_ROOT),
        }
    )


def ctl_json(args: list[str], home: Path, timeout: float = 300.0) -> tuple[int, Any]:
    """Run `kerneldctl ARGS --json`; (exit code, parsed JSON or the raw output)."""
    proc = subprocess.run(
        [KERNELDCTL, *args, "--json"],
        capture_output=True,
        text=True,
        env=ctl_env(home),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, proc.stdout[-2000:] + proc.stderr[-2000:]


def read_records(out_dir: Path) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for path in sorted(out_dir.glob("client-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                recs.append(json.loads(line))
    return recs


def _count_lines(out_dir: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in out_dir.glob("client-*.jsonl"))


def run(cfg: ChaosConfig, *, say: Callable[[str], None] = print) -> ChaosResult:
    """One chaos run; see the module docstring."""
    t_wall = time.monotonic()
    work = cfg.workdir or Path(tempfile.mkdtemp(prefix="kerneld-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    out_dir = work / "clients"
    out_dir.mkdir(exist_ok=True)
    notes: list[str] = []

    cat = build_catalog(work / "hub", synthetic=cfg.synthetic)
    cat_path = cat.save(work / "catalog.json")
    cap = cfg.cap or int(cat.best_tree_bytes * 0.3)
    say(
        f"chaos: {len(cat.choices)} choices over {len(cat.refs)} repos, "
        f"{len(cat.expected)} published variants; store cap {cap} bytes "
        f"(best variants need {cat.best_tree_bytes}); workdir {work}"
    )
    hub = ChaosHub(cat.root, trusted_orgs={EXAMPLES_ORG: True, SYNTH_ORG: True}, seed=cfg.seed)
    hub.start()
    daemon = DaemonProcess(work / "daemon", hub_endpoint=hub.url, config=daemon_config(cfg, cap))
    sup = Supervisor(daemon)
    zygote: subprocess.Popen[bytes] | None = None
    phases = FaultPhases(hub, rate=cfg.fault_rate, period_s=cfg.fault_period, seed=cfg.seed + 1)
    admin = AdminChurn(
        sup,
        cat,
        work / "ctl-home",
        every_s=cfg.admin_every,
        gc_every_s=cfg.gc_every,
        seed=cfg.seed + 2,
    )
    killer = Killer(sup, every_s=cfg.kill_every, seed=cfg.seed + 3)
    verify_online: tuple[int, Any] = (-1, "not run")
    verify_offline: tuple[int, Any] = (-1, "not run")
    final_code: int | None = None
    try:
        sup.start()
        end_time = time.time() + cfg.duration
        client_cfg = {
            "catalog": str(cat_path),
            "out_dir": str(out_dir),
            "clients": cfg.clients,
            "end_time": end_time,
            "seed": cfg.seed,
            "deadline_s": cfg.deadline,
            "hold_s": list(cfg.hold),
            "think_s": list(cfg.think),
            "long_hold_share": cfg.long_hold_share,
            "long_hold_s": list(cfg.long_hold),
            "hub_share": cfg.hub_share,
            "nice": cfg.nice,
        }
        cfg_path = work / "clients.json"
        cfg_path.write_text(json.dumps(client_cfg), encoding="utf-8")
        with open(work / "clients.log", "wb") as log:
            zygote = subprocess.Popen(
                [sys.executable, "-m", "chaos.client", str(cfg_path)],
                cwd=REPO_ROOT,
                env=client_env(work, daemon, hub.url, cfg),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        phases.start()
        admin.start()
        killer.start()
        limit = end_time + cfg.deadline + cfg.long_hold[1] + chaos_client.GRACE_S + 30
        next_note = time.time() + 10
        while zygote.poll() is None and time.time() < limit:
            time.sleep(0.5)
            if time.time() >= next_note:
                next_note += 10
                left = max(0, int(end_time - time.time()))
                say(
                    f"chaos: {_count_lines(out_dir)} ops, {len(sup.restarts)} restarts, "
                    f"{sum(hub.injected.values())} faults, {len(admin.log.ops)} kerneldctl; "
                    f"{left}s left"
                )
        if zygote.poll() is None:
            notes.append("client processes did not finish in time: killed")
            os.killpg(zygote.pid, signal.SIGKILL)
            zygote.wait(30)
        elif zygote.returncode != 0:
            notes.append(f"client zygote exited with {zygote.returncode} (see clients.log)")
        killer.stop()
        admin.stop()
        phases.stop()
        sup.ensure_running()
        if not admin.undo_all():
            notes.append("could not lift every deny and pin at the end")
        op = admin.ctl("verify", timeout=600)
        verify_online = (op.rc, op.doc if op.doc is not None else op.stderr)
        final_code = sup.stop()
        verify_offline = ctl_json(["verify", "--store", str(daemon.store_root)], work / "ctl-home")
    finally:
        if zygote is not None and zygote.poll() is None:
            os.killpg(zygote.pid, signal.SIGKILL)
            zygote.wait(30)
        for thread in (killer, admin, phases):
            thread.stop_event.set()
        sup.stop()
        daemon.close()
        hub.stop()

    records = read_records(out_dir)
    statuses: Counter[int] = Counter(r.status for r in hub.requests)
    data = RunData(
        records=records,
        cat=cat,
        admin=admin.log,
        restarts=sup.restarts,
        supervisor_problems=sup.problems + admin.problems + notes,
        verify_online=verify_online,
        verify_offline=verify_offline,
        final_stop_code=final_code,
        hub_errors=list(hub.errors),
        hub_requests=hub.counts,
        hub_statuses=statuses,
        faults_injected=hub.injected,
        phase_seconds=phases.seconds,
        phase_timeline=phases.timeline,
        file_bytes=hub.file_bytes,
        daemon_logs=daemon.logs(),
        deadline_s=cfg.deadline,
        config={"duration": cfg.duration, "clients": cfg.clients},
        wall_s=time.monotonic() - t_wall,
    )
    invs = invariants(data)
    fig = figures(data)
    ok = all(inv.ok for inv in invs)
    md = render_markdown(fig, invs, command_line(cfg))
    (work / "figures.json").write_text(json.dumps(fig, indent=2), encoding="utf-8")
    with open(work / "admin.jsonl", "w", encoding="utf-8") as f:
        for op in admin.log.ops:
            f.write(json.dumps(op.__dict__) + "\n")
    (work / "supervisor.json").write_text(
        json.dumps(
            {
                "restarts": [r.__dict__ for r in sup.restarts],
                "problems": sup.problems + admin.problems + notes,
                "pins": [w.__dict__ for w in admin.log.pins],
                "denies": [w.__dict__ for w in admin.log.denies],
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    if ok and not cfg.keep and cfg.workdir is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return ChaosResult(ok, fig, invs, md, work, notes)


def command_line(cfg: ChaosConfig) -> str:
    """The command that reproduces this configuration."""
    d = ChaosConfig()
    parts = ["python -m chaos", f"--duration {cfg.duration:g}", f"--clients {cfg.clients}"]
    for name, flag in (
        ("fault_rate", "--fault-rate"),
        ("kill_every", "--kill-every"),
        ("gc_every", "--gc-every"),
        ("admin_every", "--admin-every"),
        ("deadline", "--deadline"),
        ("hub_share", "--hub-share"),
        ("long_hold_share", "--long-hold-share"),
        ("synthetic", "--synthetic"),
        ("cap", "--cap"),
        ("seed", "--seed"),
    ):
        value = getattr(cfg, name)
        if value != getattr(d, name):
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    for name in ("hold", "think", "long_hold"):
        lo, hi = getattr(cfg, name)
        if (lo, hi) != getattr(d, name):
            parts.append(f"--{name.replace('_', '-')} {lo:g},{hi:g}")
    return " ".join(parts)


def write_report(path: Path, markdown: str) -> None:
    """Replace the marked section of `path` (or append one) with this run's figures."""
    block = f"{BEGIN}\n{markdown}{END}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + block + tail
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + "## Latest chaos run\n\n" + block
    path.write_text(text, encoding="utf-8")


def _span(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    d = ChaosConfig()
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of chaos")
    parser.add_argument("--clients", type=int, default=d.clients, help="client processes")
    parser.add_argument("--fault-rate", type=float, default=d.fault_rate)
    parser.add_argument("--kill-every", type=float, default=d.kill_every, help="seconds")
    parser.add_argument("--gc-every", type=float, default=d.gc_every, help="seconds")
    parser.add_argument("--admin-every", type=float, default=d.admin_every, help="seconds")
    parser.add_argument("--deadline", type=float, default=d.deadline, help="seconds per load")
    parser.add_argument("--hub-share", type=float, default=d.hub_share)
    parser.add_argument("--synthetic", type=int, default=d.synthetic, help="synthetic repos")
    parser.add_argument("--cap", type=int, default=None, help="store cap in bytes")
    parser.add_argument("--hold", type=_span, default=d.hold, help="LO,HI seconds a load is held")
    parser.add_argument("--think", type=_span, default=d.think, help="LO,HI seconds between loads")
    parser.add_argument("--long-hold-share", type=float, default=d.long_hold_share)
    parser.add_argument("--long-hold", type=_span, default=d.long_hold, help="LO,HI seconds")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--nice", type=int, default=d.nice, help="niceness of the clients")
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: temporary)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir after a pass")
    parser.add_argument("--report", type=Path, help="write the figures into this markdown file")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    cfg = ChaosConfig(
        duration=args.duration,
        clients=args.clients,
        fault_rate=args.fault_rate,
        kill_every=args.kill_every,
        gc_every=args.gc_every,
        admin_every=args.admin_every,
        deadline=args.deadline,
        hub_share=args.hub_share,
        synthetic=args.synthetic,
        cap=args.cap,
        hold=args.hold,
        think=args.think,
        long_hold_share=args.long_hold_share,
        long_hold=args.long_hold,
        seed=args.seed,
        nice=args.nice,
        workdir=args.workdir,
        keep=args.keep,
    )
    result = run(cfg)
    print(result.markdown)
    if args.report is not None:
        write_report(args.report, result.markdown)
    if args.json is not None:
        args.json.write_text(json.dumps(result.figures, indent=2) + "\n", encoding="utf-8")
    if not result.ok:
        print(f"chaos: FAILED; evidence kept in {result.workdir}", file=sys.stderr)
        return 1
    print("chaos: all invariants hold")
    return 0
