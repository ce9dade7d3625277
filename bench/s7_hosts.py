"""Scenario 7: H hosts cold-start at once, per site topology (issue 17 §3).

A host is a real daemon with its own store and sockets; its cold start is what a job start
makes it do: Resolve (with fetch, over the user socket) of the three bench kernels. All H
daemons are started first; the figure is from the release until the last host has all three.
Per topology, on fresh daemons (and a fresh cache):

- **direct**: every daemon talks to the Hub;
- **site cache**: every daemon talks to nginx running the shipped
  `deploy/site-cache/kerneld-site-cache.conf.template`;
- **olah**: every daemon talks to olah (a third-party Hub mirror) as a pull-through mirror;
- **static mirror**: the kernels exported once (`kerneldctl mirror export`) to a directory served
  by nginx, each daemon's only upstream (`mirror-http`).

The Hub test server counts the requests and body bytes it served. Then the Hub answers 503 to
everything and H more fresh hosts cold-start through the warm site cache and from the mirror
(not through olah: in a trial at H = 1 and 4 every such host failed, since olah does not serve the
metadata it cached while its upstream is down, and at H = 16 the round took minutes of retries).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import log, mib, table
from bench.hubrepos import COLD_KERNELS
from bench.scenario import DAEMON_CONFIG, Ctx, Goal, Section
from examples.kernels.specs import ORG
from tests.daemon.rpc import facts
from tests.support.daemon import DaemonProcess
from tests.support.hubtraffic import Fault
from tests.support.nginx import Nginx, site_cache
from tests.support.olah import run_olah

REPOS = [f"{ORG}/{name}" for name in COLD_KERNELS]
TOPOLOGIES = ("direct", "site cache", "olah", "static mirror")


def cold_start(daemons: list[DaemonProcess]) -> tuple[float, int]:
    """(seconds until the last host has every kernel, hosts that got all of them)."""
    from kerneld_client.proto import kerneld_pb2 as pb

    platform = facts()
    ok = [False] * len(daemons)
    go = threading.Event()

    def host(i: int, d: DaemonProcess) -> None:
        with d.kernels() as kernels:
            go.wait()
            try:
                for repo in REPOS:
                    req = pb.ResolveRequest(
                        kernel=pb.KernelRef(repo_id=repo, version=1),
                        platform=platform,
                        allow_fetch=True,
                        client="bench-s7",
                    )
                    kernels.Resolve(req, timeout=120)
                ok[i] = True
            except Exception as exc:
                log(f"host {i}: {exc!r}"[:300])

    threads = [threading.Thread(target=host, args=(i, d)) for i, d in enumerate(daemons)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # every host has its channel open
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, sum(ok)


class Hosts:
    """Fresh daemons, each with its own store; all stopped at close()."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.count = 0
        self.started: list[DaemonProcess] = []

    def start(self, n: int, **kwargs: Any) -> list[DaemonProcess]:
        out = []
        for _ in range(n):
            self.count += 1
            d = DaemonProcess(self.work / f"host-{self.count}", config=DAEMON_CONFIG, **kwargs)
            self.started.append(d)
            out.append(d.start())
        return out

    def close(self) -> None:
        for d in self.started:
            d.close()
        self.started.clear()


def one_h(ctx: Ctx, h: int) -> dict[str, Any]:
    server, work = ctx.server, ctx.work / f"s7-h{h}"
    hosts = Hosts(work)
    row: dict[str, Any] = {"h": h}
    try:
        for topology in TOPOLOGIES:
            stack = contextlib.ExitStack()
            nginx: Nginx | None = None
            if topology == "direct":
                kwargs: dict[str, Any] = {"hub_endpoint": server.url}
            elif topology == "site cache":
                nginx = site_cache(server.url, work / "cache", cache_max="4g")
                kwargs = {"hub_endpoint": nginx.url}
            elif topology == "olah":
                (work / "olah").mkdir(parents=True, exist_ok=True)
                olah = stack.enter_context(
                    run_olah(work / "olah", probe_repo=REPOS[0], upstream=server.url)
                )
                kwargs = {"hub_endpoint": olah.url}
            else:
                mirror = work / "mirror"
                source = row["exporter"]
                ctl = str(Path(sys.executable).parent / "kerneldctl")
                argv = [ctl, "mirror", "export", "--admin-socket", str(source.admin_socket)]
                argv += ["--to", str(mirror), *(f"{repo}:1" for repo in REPOS)]
                subprocess.run(argv, check=True, capture_output=True, timeout=300)
                nginx = Nginx(mirror, work / "mirror-nginx")
                kwargs = {"upstreams": [{"kind": "mirror-http", "name": "site", "url": nginx.url}]}
            daemons = hosts.start(h, **kwargs)
            server.reset_counts()
            wall, ok = cold_start(daemons)
            row[topology] = {
                "wall": wall,
                "ok": ok,
                "requests": server.total(),
                "bytes": server.total_bytes(),
            }
            row.setdefault("exporter", daemons[0])
            log(f"H={h} {topology}: {row[topology]}")
            if topology in ("site cache", "static mirror"):
                # The Hub goes down; H more fresh hosts cold-start from the warm cache/mirror.
                server.inject(Fault("*", "error", status=503))
                try:
                    more = hosts.start(h, **kwargs)
                    wall, ok = cold_start(more)
                    row[topology]["down"] = {"wall": wall, "ok": ok}
                finally:
                    server.clear_faults()
            if nginx is not None:
                nginx.stop()
            stack.close()
    finally:
        hosts.close()
    row.pop("exporter", None)
    return row


def run(ctx: Ctx) -> Section:
    rows = [one_h(ctx, h) for h in ctx.args.hosts]
    return report(ctx, rows)


def report(ctx: Ctx, rows: list[dict[str, Any]]) -> Section:
    sec = Section("s7", "7. Many hosts: Hub cost per site topology")
    sec.settings = f"H = {', '.join(str(r['h']) for r in rows)}; one run each"
    body = []
    for r in rows:
        for topology in TOPOLOGIES:
            t = r[topology]
            down = t.get("down")
            body.append(
                [
                    r["h"],
                    topology,
                    t["requests"],
                    mib(t["bytes"]),
                    f"{t['wall']:.2f}",
                    f"{t['ok']}/{r['h']}",
                    "-" if down is None else f"{down['ok']}/{r['h']} in {down['wall']:.2f} s",
                ]
            )
    sec.lines = [
        "See `bench/s7_hosts.py`: H real daemons (own stores) cold-start the three bench "
        "kernels at once, per topology, on fresh daemons; Hub requests and body bytes as the "
        "Hub test server counted them; then the Hub answers 503 to everything and H more fresh "
        "hosts cold-start from what the site already has.",
        "",
        *table(
            [
                "H",
                "topology",
                "Hub requests",
                "Hub MiB",
                "wall s",
                "hosts with all 3",
                "Hub down: hosts with all 3",
            ],
            body,
        ),
    ]
    first, last = rows[0], rows[-1]
    cached = [r["site cache"]["requests"] for r in rows]
    sec.goals.append(
        Goal(
            f"through the site cache, Hub requests at H = {last['h']} no more than at "
            f"H = {first['h']}",
            cached[-1] <= cached[0] if len(rows) > 1 else None,
            f"{cached[0]} at H = {first['h']}, {cached[-1]} at H = {last['h']} (direct: "
            f"{first['direct']['requests']} and {last['direct']['requests']})",
        )
    )
    down = [r[t]["down"]["ok"] == r["h"] for r in rows for t in TOPOLOGIES if "down" in r[t]]
    sec.goals.append(
        Goal(
            "every host still cold-starts when the Hub is down after the cache is warm",
            all(down),
            f"{sum(down)} of {len(down)} (H, topology) rounds had every host load all three",
        )
    )
    sec.plots = ["hosts_hub_requests.png"]
    sec.data["rows"] = rows
    return sec


def plot(sec: Section, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[dict[str, Any]] = sec.data["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    hs = [r["h"] for r in rows]
    for topology in TOPOLOGIES:
        ax.plot(hs, [r[topology]["requests"] for r in rows], marker="o", label=topology)
    ax.set_xlabel("hosts cold-starting at once (H)")
    ax.set_ylabel("requests to the Hub")
    ax.set_xticks(hs)
    ax.set_title("Hub requests per site topology")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "hosts_hub_requests.png")
    plt.close(fig)
    return sec.plots
