"""Soak an import-only daemon past `ref_ttl` for minutes: is its log free of warnings?

Issue 51 asks for a journal with no warning over 10 minutes past `ref_ttl` on an import-only
host; the suite (tests/daemon/test_import_only.py) checks seconds of it. Not part of
`make bench` (it takes `--minutes`). Run by hand, as root (the daemons run as the unprivileged
`kerneld` user, as the unit runs them) or as an ordinary user:

    .venv/bin/python -m bench.import_only_soak [--minutes 10] [--ref-ttl 2s] [--every 5]
                                               [--prefetch-interval 10s]

Real parts, no systemd: an export daemon fetches the suite's test kernel from a mirror
directory and exports it as a signed bundle (`kerneldctl mirror export --sign-key`); the
import-only daemon (`upstream = []`, `[trust] allow = []`, the exporter's key trusted,
`HF_ENDPOINT` at a loopback test Hub that counts every request) imports it, and the imported
kernel goes into its `[prefetch] kernels` (a reload; the timer every `--prefetch-interval`,
which finds it in the store and fetches nothing). Then, for
`--minutes`, every `--every` seconds: a job process (`kerneld_client.get_kernel`,
`KERNELD_REQUIRE=1`, `KERNELD_REF_MAX_AGE=0`: it asks the daemon to re-check the ref each time)
and a Resolve RPC. Each minute, and at the end, it reports the daemon's WARNING/ERROR lines, the
`kerneld_ref_rechecks_total` outcomes, `kerneld_stale_serves_total`, the test Hub's requests and
the daemon's TCP/UDP sockets. Exit status 1 if any of those is not zero or a job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kerneld.mirror.keys import generate_key
from tests.client.support import client_env
from tests.daemon.rpc import TIMEOUT, http_get_unix, resolve_req
from tests.daemon.test_import_only import _inet_sockets
from tests.fixtures_daemon import ACT, build_kernel_mirror
from tests.security.support import CPU_FACTS
from tests.support.ctl import run_ctl
from tests.support.daemon import REPO_ROOT, DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer

JOB = f"""
import json, kerneld_client
kerneld_client.get_kernel({ACT!r}, version=1)
print(json.dumps({{"source": kerneld_client.loaded_kernels()[-1].source}}))
"""
WARNING = re.compile(r" (WARNING|ERROR|CRITICAL) ")


def metric_lines(text: str, name: str) -> dict[str, float]:
    """`name`'s samples: their label text (or "") -> value."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            found[head[len(name) :] or ""] = float(value)
    return found


def ctl(d: DaemonProcess, home: Path, keys: Path, *args: str) -> str:
    env = {
        "KERNELD_ADMIN_SOCKET": str(d.admin_socket),
        "KERNELD_SOCKET": str(d.user_socket),
        "KERNELD_KEY_DIR": str(keys),
    }
    done = run_ctl(*args, home=home, env=env, timeout=120)
    if done.rc != 0:
        raise SystemExit(f"kerneldctl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def job(d: DaemonProcess, tmp: Path) -> str:
    """One job process; its source ("daemon", "index") or its failure."""
    env = client_env(
        d.store_root,
        tmp,
        KERNELD_SOCKET=str(d.user_socket),
        KERNELD_PLATFORM_JSON=CPU_FACTS,
        KERNELD_REQUIRE="1",
        KERNELD_REF_MAX_AGE="0",
    )
    ran = subprocess.run(
        [sys.executable, "-c", JOB],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if ran.returncode != 0:
        return f"failed: {ran.stderr.strip().splitlines()[-1:]}"
    source: str = json.loads(ran.stdout.strip().splitlines()[-1])["source"]
    return source


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--ref-ttl", default="2s", help="the import-only daemon's [resolve] ref_ttl")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between jobs")
    ap.add_argument("--prefetch-interval", default="10s", help="[prefetch] interval")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="kd-soak-") as tmpdir:
        tmp = Path(tmpdir)
        tmp.chmod(0o755)
        mirror = build_kernel_mirror(tmp / "mirror")
        keys = tmp / "keys"
        key = generate_key("site-1", keys)
        home = tmp / "home"
        no_gpu = tmp / "no-gpu-host"
        no_gpu.mkdir()
        exporter = DaemonProcess(tmp / "exporter", mirror_dirs=[mirror], hardware_root=no_gpu)
        metrics = daemon_dir("kd-soak-") / "metrics.sock"
        with HubServer(tmp / "hub-root") as hub, exporter:
            ctl(exporter, home, keys, "prefetch", f"{ACT}:1", "--variants", "all")
            bundle = tmp / "usb" / "kernels.tar"
            bundle.parent.mkdir()
            ctl(exporter, home, keys, "mirror", "export", "--to", str(bundle), f"{ACT}:1",
                "--sign-key", "site-1")  # fmt: skip
            exporter.stop()
            host = DaemonProcess(
                tmp / "import-only",
                config={
                    "upstream": [],
                    "trust": {"allow": []},
                    "resolve": {"ref_ttl": args.ref_ttl},
                    "mirror": {"trusted_keys": {"site-1": key.public}},
                    "metrics": {"socket": str(metrics)},
                },
                env={"HF_ENDPOINT": hub.url},
            )
            with host:
                ctl(host, home, keys, "mirror", "import", "--from", str(bundle))
                # Then the admin names it in [prefetch] (a reload), as the docs' order has it.
                prefetch = {"kernels": [f"{ACT}:1"], "interval": args.prefetch_interval}
                host.write_config({"prefetch": prefetch})
                host.send_signal(signal.SIGHUP)
                host.wait_for_log("config reloaded")
                return soak(host, hub, metrics, tmp, args)
    return 1  # not reached


def soak(
    host: DaemonProcess, hub: HubServer, metrics: Path, tmp: Path, args: argparse.Namespace
) -> int:
    """Jobs and Resolves every `args.every` s for `args.minutes`; the report, its verdict."""
    started = time.monotonic()
    end = started + args.minutes * 60
    jobs: dict[str, int] = {}
    resolves = 0
    print(
        f"import-only soak: ref_ttl {args.ref_ttl}, [prefetch] interval "
        f"{args.prefetch_interval}, a job and a Resolve every {args.every:g} s for "
        f"{args.minutes:g} min (daemon pid {host.pid})",
        flush=True,
    )
    print("| minute | jobs (source: n) | Resolves | warning lines | ref re-checks | stale serves "
          "| test Hub requests | TCP/UDP sockets |", flush=True)  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    minute = 0
    bad = False
    while True:
        now = time.monotonic()
        if now >= end:
            break
        source = job(host, tmp)
        jobs[source] = jobs.get(source, 0) + 1
        with host.kernels() as kernels:
            answer = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
            resolves += 1
            bad |= answer.kernel.stale or not answer.kernel.path
        if int((time.monotonic() - started) // 60) > minute or time.monotonic() >= end:
            minute = int((time.monotonic() - started) // 60)
            bad |= report(minute, host, hub, metrics, jobs, resolves)
        time.sleep(max(0.0, min(args.every, end - time.monotonic())))
    bad |= report(round((time.monotonic() - started) / 60, 1), host, hub, metrics, jobs, resolves)
    ticks = host.logs().count("scheduled prefetch done")
    print(f"scheduled prefetch runs: {ticks}", flush=True)
    print("verdict:", "FAILED" if bad else "clean", flush=True)
    return 1 if bad else 0


def report(
    minute: float,
    host: DaemonProcess,
    hub: HubServer,
    metrics: Path,
    jobs: dict[str, int],
    resolves: int,
) -> bool:
    """One row of the table; True when something is wrong."""
    text = http_get_unix(metrics)
    rechecks = metric_lines(text, "kerneld_ref_rechecks_total")
    stale = sum(metric_lines(text, "kerneld_stale_serves_total").values())
    warnings = [line for line in host.logs().splitlines() if WARNING.search(line)]
    sockets = _inet_sockets(host.pid)
    failed = {k: v for k, v in jobs.items() if k not in ("daemon", "index")}
    print(
        f"| {minute} | {jobs} | {resolves} | {len(warnings)} | "
        f"{ {k: int(v) for k, v in rechecks.items()} or 0 } | {int(stale)} | {hub.total()} | "
        f"{len(sockets)} |",
        flush=True,
    )
    for line in warnings[-3:]:
        print(f"    {line}", flush=True)
    return bool(warnings or any(rechecks.values()) or stale or hub.total() or sockets or failed)


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    raise SystemExit(main())
