"""What an unmodified `kernels` job gets from the Hub endpoint when the daemon restarts, is
stopped, or the repo is missing; with the daemon binding its own port and with kerneld.socket.

Not part of `make bench` (it needs root: systemd as PID 1 in a container). Run by hand:

    .venv/bin/python -m bench.endpoint_restart [--modes service,socket] [--jobs 16]
                                               [--rounds 3] [--gap 0.2]

A container (tests/systemd/container.py: systemd 252 as PID 1 on an overlay of this machine)
runs the units of systemd/ with this checkout's daemon, `[hub_api] listen` on a loopback port,
the example kernels from a loopback `mirror-http` upstream (the store is warmed once). Jobs are
`kernels` 0.19.1 in a clean venv (tests/hubapi/venvs.py), run as a `kerneld-users` member with
`HF_ENDPOINT` at the daemon and an empty HF cache each (`bench/endpoint_job.py`).

- **restart**: per round, `--jobs` processes import torch and `kernels`, then start their
  `get_kernel` every `--gap` s from 0.4 s before `systemctl restart kerneld` on; a prober
  connects to the port every 20 ms and says whether each connection was refused. Counted:
  failed loads, refused connections, how long `systemctl restart` took.
- **cases**: one job each for a repo the upstream lacks, the daemon stopped (empty HF cache;
  HF cache holding the kernel, online and with HF_HUB_OFFLINE=1) and, with kerneld.socket, the
  service stopped but the socket listening. Prints what each job got.

`service`: today's unit alone, the daemon binding the port itself (a privileged one: a drop-in
gives it CAP_NET_BIND_SERVICE, as a container would). `socket`: kerneld.socket holds the port (a
drop-in sets it) and passes it to the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.kernels.build import build_examples
from examples.main_job import MirrorServer
from examples.mirror import build_example_mirror
from tests.hubapi.venvs import make_venv
from tests.support.daemon import REPO_ROOT
from tests.systemd.container import BASE_ENV, Container, unavailable_reason

KERNEL = "kerneld-examples/activation"
MISSING = "kerneld-examples/no-such-kernel"
RELEASE = "0.19.1"
JOB = REPO_ROOT / "bench" / "endpoint_job.py"
UNITS = REPO_ROOT / "systemd"
#: Where the jobs' HF caches and the round's start file live in the container.
WORK = "/var/tmp/endpoint-bench"


def config(mirror_url: str, port: int) -> str:
    return f"""# bench/endpoint_restart.py
[[upstream]]
name = "examples"
kind = "mirror-http"
url = "{mirror_url}"

[prefetch]
on_start = false

[server]
drain_timeout = "5s"

[hub_api]
listen = "127.0.0.1:{port}"

[trust]
allow = ["kerneld-examples/*"]
"""


def socket_dropin(port: int) -> str:
    return f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{port}\n"


def free_port() -> int:
    """A free privileged loopback port: a system daemon serves the endpoint on no other
    (kerneld/server/plumbing/exposure.py); run as root, as the container needs."""
    for port in range(1000, 600, -1):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port between 601 and 1000")


#: `service` mode: the daemon binds the privileged port itself, as one in a container would.
BIND_DROPIN = (
    "[Service]\nCapabilityBoundingSet=CAP_NET_BIND_SERVICE\n"
    "AmbientCapabilities=CAP_NET_BIND_SERVICE\n"
)


def ok(c: Container, argv: list[str], timeout: float = 60.0) -> str:
    ran = c.run(argv, timeout=timeout)
    if ran.rc != 0:
        raise RuntimeError(str(ran))
    return ran.out


def install(c: Container, mode: str, mirror_url: str, port: int) -> None:
    """The units of systemd/ with this checkout's daemon (its .venv, linked: no pip install)."""
    root = c.root
    for name in ("passwd", "group", "shadow", "gshadow"):  # a host kerneld never ran on
        path = root / "etc" / name
        lines = []
        for line in path.read_text().splitlines():
            fields = line.split(":")
            if fields[0] in ("kerneld", "kerneld-users", "kerneld-admin"):
                continue
            if name in ("group", "gshadow"):
                fields[-1] = ",".join(m for m in fields[-1].split(",") if m and m != "kerneld")
            lines.append(":".join(fields))
        path.write_text("\n".join(lines) + "\n")
    units = root / "etc" / "systemd" / "system"
    shutil.copy(UNITS / "kerneld.service", units / "kerneld.service")
    if mode == "socket":
        shutil.copy(UNITS / "kerneld.socket", units / "kerneld.socket")
        (units / "kerneld.socket.d").mkdir(exist_ok=True)
        (units / "kerneld.socket.d" / "port.conf").write_text(socket_dropin(port))
    else:
        (units / "kerneld.service.d").mkdir(exist_ok=True)
        (units / "kerneld.service.d" / "bind.conf").write_text(BIND_DROPIN)
    for rel, src in (
        ("usr/lib/sysusers.d/kerneld.conf", "kerneld.sysusers"),
        ("usr/lib/tmpfiles.d/kerneld.conf", "kerneld.tmpfiles"),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(UNITS / src, root / rel)
    for tool in ("kerneld", "kerneldctl"):
        link = root / "usr" / "bin" / tool
        link.unlink(missing_ok=True)
        link.symlink_to(REPO_ROOT / ".venv" / "bin" / tool)
    (root / "etc" / "kerneld").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "kerneld" / "kerneld.toml").write_text(config(mirror_url, port))
    ok(c, ["systemd-sysusers", "/usr/lib/sysusers.d/kerneld.conf"])
    ok(c, ["systemd-tmpfiles", "--create", "/usr/lib/tmpfiles.d/kerneld.conf"])
    if c.run(["id", "alice"]).rc != 0:
        ok(c, ["useradd", "--create-home", "alice"])
    ok(c, ["usermod", "-aG", "kerneld-users", "alice"])
    ok(c, ["install", "-d", "-m", "1777", WORK])
    ok(c, ["systemctl", "daemon-reload"])
    units_started = ["kerneld.socket", "kerneld"] if mode == "socket" else ["kerneld"]
    ok(c, ["systemctl", "start", *units_started], timeout=120)


def job_argv(c: Container, python: Path, args: dict[str, Any]) -> list[str]:
    inner = ["runuser", "-u", "alice", "--", str(python), str(JOB), json.dumps(args)]
    return ["nsenter", f"--target={c.leader}", "--all", *inner]


def job_env(port: int) -> dict[str, str]:
    return {**BASE_ENV, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HOME": "/home/alice"}


def one_job(c: Container, python: Path, port: int, args: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        job_argv(c, python, args),
        env=job_env(port),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error_type": "job crashed", "error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = done.stderr
    return result


@dataclass
class Prober:
    """Connects to the port every 20 ms and sends one request: refused, or answered."""

    port: int
    outcomes: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=15) as s:
                    s.sendall(b"GET /api/kernels/kerneld-examples/activation HTTP/1.0\r\n\r\n")
                    first = s.recv(64)
                    outcome = "answered" if first.startswith(b"HTTP/") else "no answer"
            except ConnectionRefusedError:
                outcome = "refused"
            except OSError as exc:
                outcome = f"error {type(exc).__name__}"
            self.outcomes.append((t, outcome))
            time.sleep(max(0.0, 0.02 - (time.time() - t)))


def restart_round(
    c: Container, python: Path, port: int, jobs: int, gap: float, tag: str
) -> dict[str, Any]:
    go_inside = f"{WORK}/go-{tag}"
    go_host = c.root / go_inside.lstrip("/")
    procs = []
    for i in range(jobs):
        args = {"repo": KERNEL, "hf_home": f"{WORK}/hf-{tag}-{i}", "go": go_inside, "at": i * gap}
        procs.append(
            subprocess.Popen(
                job_argv(c, python, args),
                env=job_env(port),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:  # every job has imported torch and kernels
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(
                f"a job did not start: {line!r} {p.stderr.read() if p.stderr else ''}"
            )
    prober = Prober(port)
    prober.start()
    t0 = time.time() + 0.5
    tmp = go_host.with_name(go_host.name + ".tmp")  # whole or absent: the jobs poll for it
    tmp.write_text(f"{t0}")
    tmp.rename(go_host)
    time.sleep(max(0.0, t0 + 0.4 - time.time()))
    restart_at = time.time()
    ran = c.run(["systemctl", "restart", "kerneld"], timeout=120)
    restart_s = time.time() - restart_at
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else {"ok": False, "error": err[-500:]})
    time.sleep(0.3)
    prober.stop()
    in_window = [o for t, o in prober.outcomes if restart_at - 0.5 <= t <= restart_at + restart_s]
    return {
        "restart_rc": ran.rc,
        "restart_s": restart_s,
        "loads": len(results),
        "failed": [r for r in results if not r.get("ok")],
        "probes": Counter(o for _, o in prober.outcomes),
        "probes_in_window": Counter(in_window),
    }


def cases(c: Container, python: Path, port: int, mode: str) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}
    warm = f"{WORK}/hf-warm-{mode}"
    got["daemon up, empty HF cache"] = one_job(c, python, port, {"repo": KERNEL, "hf_home": warm})
    got["repo the upstream lacks"] = one_job(
        c, python, port, {"repo": MISSING, "hf_home": f"{WORK}/hf-missing-{mode}"}
    )
    stop = ["kerneld.socket", "kerneld"] if mode == "socket" else ["kerneld"]
    ok(c, ["systemctl", "stop", *stop], timeout=120)
    got["daemon stopped, empty HF cache"] = one_job(
        c, python, port, {"repo": KERNEL, "hf_home": f"{WORK}/hf-down-{mode}"}
    )
    got["daemon stopped, HF cache holds the kernel"] = one_job(
        c, python, port, {"repo": KERNEL, "hf_home": warm}
    )
    got["daemon stopped, HF cache holds the kernel, HF_HUB_OFFLINE=1"] = one_job(
        c, python, port, {"repo": KERNEL, "hf_home": warm, "offline": True}
    )
    if mode == "socket":
        ok(c, ["systemctl", "start", "kerneld.socket"])
        got["service stopped, kerneld.socket listening, empty HF cache"] = one_job(
            c, python, port, {"repo": KERNEL, "hf_home": f"{WORK}/hf-activate-{mode}"}
        )
        got["service stopped, kerneld.socket listening, empty HF cache"]["service_after"] = c.run(
            ["systemctl", "is-active", "kerneld"]
        ).out.strip()
    ok(c, ["systemctl", "start", *reversed(stop)], timeout=120)
    return got


def run_mode(mode: str, args: argparse.Namespace, python: Path, mirror_url: str) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="endpoint-bench-", dir=args.tmp))
    port = free_port()
    with Container(base / "c", f"kd-bench-{os.getpid()}-{mode}") as c:
        c.mount()
        c.boot()
        install(c, mode, mirror_url, port)
        warm = one_job(c, python, port, {"repo": KERNEL, "hf_home": f"{WORK}/hf-first"})
        if not warm.get("ok"):
            raise RuntimeError(f"the first load failed: {warm}\n{c.journal('kerneld')[-3000:]}")
        rounds = [
            restart_round(c, python, port, args.jobs, args.gap, f"{mode}-{r}")
            for r in range(args.rounds)
        ]
        got = cases(c, python, port, mode)
        journal = c.journal("kerneld")
    shutil.rmtree(base, ignore_errors=True)
    return {"rounds": rounds, "cases": got, "journal_tail": journal[-3000:]}


def report(mode: str, res: dict[str, Any]) -> None:
    loads = sum(r["loads"] for r in res["rounds"])
    failed = sum(len(r["failed"]) for r in res["rounds"])
    refused = sum(r["probes_in_window"].get("refused", 0) for r in res["rounds"])
    probes = sum(sum(r["probes_in_window"].values()) for r in res["rounds"])
    secs = ", ".join(f"{r['restart_s']:.2f}" for r in res["rounds"])
    print(
        f"\n== {mode}: {failed}/{loads} loads failed; {refused}/{probes} probe connections "
        f"refused during the restarts; systemctl restart took {secs} s"
    )
    kinds = Counter(
        f"{f.get('error_type')}: {str(f.get('error'))[:160]}"
        for r in res["rounds"]
        for f in r["failed"]
    )
    for what, n in kinds.most_common():
        print(f"   {n} x {what}")
    for r in res["rounds"]:
        print(f"   round: restart rc {r['restart_rc']}, probes {dict(r['probes_in_window'])}")
    for name, got in res["cases"].items():
        text = "loaded" if got.get("ok") else f"{got.get('error_type')}: {got.get('error')}"
        print(f"-- {name}: {text}")
        if got.get("causes"):
            print(f"   caused by: {got['causes']}")
        if "service_after" in got:
            print(f"   kerneld.service afterwards: {got['service_after']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="service,socket")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=0.2)
    parser.add_argument("--tmp", default=None, help="where the containers' overlays go")
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"endpoint_restart: {reason}", file=sys.stderr)
        return 2
    venvs = REPO_ROOT / ".cache" / "outage-venvs"
    python = make_venv(venvs, [f"kernels=={RELEASE}"])
    mirror = build_example_mirror(built=build_examples()).root
    results = {}
    with MirrorServer(mirror) as server:
        for mode in args.modes.split(","):
            results[mode] = run_mode(mode, args, python, server.url)
            report(mode, results[mode])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
