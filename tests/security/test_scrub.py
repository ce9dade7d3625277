"""The daemon's periodic scrub: a blob that rots on disk is found, taken out of service and
fetched again, one log line and a metric per event, without holding up serving; and a process
that asked for KERNELD_VERIFY=1 never imports the rotten bytes meanwhile."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneld.config import (
    DEFAULT_SCRUB_INTERVAL_S,
    DEFAULT_SCRUB_RATE,
    ConfigError,
    dump_config,
    load_config,
)
from kerneld.store import Store, TreeFile
from kerneld.store.scrub import META_CURSOR, META_LAST, Damage, ScrubCancelled
from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, http_get_unix, metric, resolve_req
from tests.fixtures_daemon import ACT, C1, DEP_BOTTOM
from tests.security.support import CPU_FACTS
from tests.security.test_client_verify import flip_byte
from tests.support.daemon import DaemonProcess, account, default_user
from tests.support.mirrors import variant, write_mirror

CPU_VARIANT = "torch213-cxx11-cpu-x86_64-linux"


# ------------------------------------------------------------------------------- config


def test_scrub_keys_parse_and_fail_with_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text("")
    cfg = load_config(path, env={})
    assert (cfg.scrub_interval_s, cfg.scrub_rate_bytes) == (7 * 86400, 32 << 20)
    assert (DEFAULT_SCRUB_INTERVAL_S, DEFAULT_SCRUB_RATE) == (7 * 86400, 32 << 20)
    path.write_text('[store]\nscrub_interval = "12h"\nscrub_rate = "100MB"\n')
    cfg = load_config(path, env={})
    assert (cfg.scrub_interval_s, cfg.scrub_rate_bytes) == (43200, 100_000_000)
    again = tmp_path / "again.toml"
    again.write_text(dump_config(cfg))
    assert load_config(again, env={}).scrub_rate_bytes == 100_000_000
    path.write_text("[store]\nscrub_interval = 0\nscrub_rate = 0\n")
    assert load_config(path, env={}).scrub_interval_s == 0  # off
    for text, key in (
        ('scrub_interval = "weekly"', "store.scrub_interval"),
        ('scrub_interval = "500ms"', "store.scrub_interval"),
        ('scrub_rate = "fast"', "store.scrub_rate"),
        ("scrub_rate = -1", "store.scrub_rate"),
    ):
        path.write_text(f"[store]\n{text}\n")
        with pytest.raises(ConfigError) as info:
            load_config(path, env={})
        assert info.value.key == key and str(path) in str(info.value)


# ------------------------------------------------------------------------------- store level


def _publish_trees(root: Path, n: int) -> list[Path]:
    paths = []
    with Store.open(root, min_age_s=0) as store:
        for i in range(n):
            files = {"__init__.py": f"N = {i}\n".encode(), "metadata.json": b'{"id": "_k%d"}' % i}
            tree = []
            for rel, data in files.items():
                sha = hashlib.sha256(data).hexdigest()
                store.blobs.ingest(data, size=len(data), sha256=sha)
                tree.append(TreeFile(rel, sha, len(data)))
            paths.append(
                store.trees.publish_tree(f"sec/k{i}", f"{i:040x}", "torch-universal", tree).path
            )
    return paths


def test_an_interrupted_scrub_resumes_where_it_stopped(tmp_path: Path) -> None:
    """Cancelled after the first damaged tree (the stop comes from the damage callback), the
    pass records its cursor; the next pass resumes after it and then clears it."""
    paths = sorted(_publish_trees(tmp_path / "store", 5), key=lambda p: p.name)
    victim = paths[1]
    flip_byte(victim / "__init__.py", offset=0)
    stop = threading.Event()
    damage: list[Damage] = []
    with Store.open(tmp_path / "store", min_age_s=0) as store:

        def on_damage(d: Damage) -> None:
            damage.append(d)
            stop.set()

        with pytest.raises(ScrubCancelled):
            store.scrub.run_pass(rate=0, stop=stop, on_damage=on_damage)
        assert store.meta.get(META_CURSOR) == victim.name
        assert {d.problem.kind for d in damage} == {"corrupt"}
        # Invalidated and deleted before the pass stopped.
        assert not victim.exists()
        assert store.catalog.lookup("sec/k1", f"{1:040x}", "torch-universal") is None
        report = store.scrub.run_pass(rate=0, stop=threading.Event())
        assert report.completed and report.resumed_after == victim.name
        assert report.trees_checked == 3  # only the trees after the cursor
        assert store.meta.get(META_CURSOR) is None and store.meta.get(META_LAST)
        assert store.repair.verify().clean


# ------------------------------------------------------------------------------- the daemon


CLIENT = """
import json, torch, kerneld_client
try:
    mod = kerneld_client.get_kernel({repo!r}, version=1, policy="error")
    out = {{"name": mod.NAME}}
except kerneld_client.KernelError as exc:
    out = {{"error": type(exc).__name__, "message": str(exc)}}
print(json.dumps(out))
"""


def _client(d: DaemonProcess, tmp: Path, repo: str = ACT, **env: str) -> dict[str, object]:
    extra = {"KERNELD_SOCKET": str(d.user_socket), "KERNELD_PLATFORM_JSON": CPU_FACTS, **env}
    environ = client_env(d.store_root, tmp, **extra)
    return run_client(CLIENT.format(repo=repo), environ)


def _metrics_path() -> Path:
    """A directory the daemon may create its metrics socket in (it runs as `kerneld` when the
    tests run as root)."""
    base = Path(tempfile.mkdtemp(prefix="kd-m-", dir="/tmp"))
    user = default_user()
    if user is not None:
        pw = account(user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    return base / "metrics.sock"


def _wait_passes(d: DaemonProcess, count: int, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = d.logs()
        if text.count("scrub: pass completed") >= count:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{count} scrub pass(es) not completed in {timeout}s:\n{d.logs()}")


def test_a_rotten_blob_is_found_repaired_and_never_served_verified(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    metrics = _metrics_path()
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={"store": {"scrub_interval": 0}, "metrics": {"socket": str(metrics)}},
    )
    with d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    assert hit.variant == CPU_VARIANT
    init = Path(hit.path) / "__init__.py"
    original = init.read_bytes()
    flip_byte(init, offset=original.index(b"_act") + 1)  # '_act' -> '_`ct': still valid Python
    rotten = init.read_bytes()
    assert rotten != original and len(rotten) == len(original)

    # The per-load checks cannot see it: without the knob the rotten code runs...
    assert _client(d, tmp_path)["name"] == rotten.split(b"'")[1].decode()
    # ...with KERNELD_VERIFY=1 it is refused before any of it runs. (Loaded from the index;
    # the daemon is not told, so that the scrub is what finds it here: a job's report is
    # tests/daemon/test_report_suspect.py.)
    refused = _client(d, tmp_path, KERNELD_VERIFY="1", KERNELD_SOCKET=str(tmp_path / "no.sock"))
    assert refused["error"] == "CorruptTree", refused
    assert "__init__.py do(es) not match" in str(refused["message"])
    # `kerneldctl verify` (Admin.Verify) sees it too.
    with d.admin() as admin:
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert pb.VerifyEvent.CORRUPT in [e.problem for e in events]

        # Turn the scrub on: it finds the rotten blob, drops the tree and fetches it again.
        d.write_config({"store": {"scrub_interval": "1s", "scrub_rate": "64MiB"}})
        assert admin.ReloadConfig(pb.ReloadConfigRequest(), timeout=TIMEOUT).changed
        logs = _wait_passes(d, 1)
    where = f"repo={ACT} commit={C1} variant={CPU_VARIANT}"
    lines = [line for line in logs.splitlines() if "kerneld.scrub" in line or "invalidated" in line]
    corrupt = [line for line in lines if re.search(r"scrub: corrupt (tree|blob)", line)]
    assert corrupt and all(where in line for line in corrupt), lines
    assert any("invalidated damaged tree" in line and where in line for line in lines), lines
    refetched = [line for line in lines if "scrub: re-fetched" in line]
    assert len(refetched) == 1 and where in refetched[0], lines
    # Quarantined first (never deleted), then dropped because the re-fetch replaced it.
    assert any("its quarantined copy is dropped" in line for line in lines), lines
    assert list((d.store_root / "v1" / "quarantine").iterdir()) == []
    completed = next(line for line in lines if "scrub: pass completed" in line)
    assert "damaged=" in completed and "refetched=1/1" in completed, completed

    text = http_get_unix(metrics)
    assert metric(text, "kerneld_scrub_problems_total", kind="corrupt") >= 1
    assert metric(text, "kerneld_scrub_invalidated_trees_total") == 1
    assert metric(text, "kerneld_scrub_refetches_total", result="ok") == 1
    assert metric(text, "kerneld_scrub_runs_total", result="completed") >= 1
    assert metric(text, "kerneld_scrub_bytes_total") > 0
    assert metric(text, "kerneld_scrub_last_completed_timestamp_seconds") > 0

    # Healed: the same tree, intact again, verifiable, and the daemon's own check is clean.
    assert init.read_bytes() == original
    assert _client(d, tmp_path, KERNELD_VERIFY="1")["name"] == original.split(b"'")[1].decode()
    with d.admin() as admin:
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in events] == [pb.VerifyEvent.SUMMARY], events
    # The next passes find nothing more to do.
    later = _wait_passes(d, 2)
    assert later.count("scrub: re-fetched") == 1


def test_the_scrub_keeps_to_its_rate_and_never_blocks_serving(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    big = "kerneld-sec/big"
    payload = os.urandom(12 << 20)
    write_mirror(
        tmp_path / "big-mirror",
        {big: {C1: {"torch-universal": variant("_sec_big", extra={"big.bin": payload})}}},
        branches={big: {"v1": C1}},
    )
    rate = 8 << 20
    d = make_daemon(
        mirror_dirs=[tmp_path / "big-mirror", kernel_mirror],
        config={"store": {"scrub_interval": 0, "scrub_rate": rate}},
    )
    with d.kernels() as kernels, d.admin() as admin:
        kernels.Resolve(resolve_req(big, 1), timeout=TIMEOUT)
        kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
        start = len(d.logs())
        # Never scrubbed: the first pass is due one interval after the store was created.
        d.write_config({"store": {"scrub_interval": "1s"}})
        admin.ReloadConfig(pb.ReloadConfigRequest(), timeout=TIMEOUT)
        d.wait_for_log("scrub: pass started", timeout=10)
        worst, calls, fetched = 0.0, 0, False
        while "scrub: pass completed" not in d.logs()[start:]:
            t0 = time.perf_counter()
            kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT)
            worst = max(worst, time.perf_counter() - t0)
            calls += 1
            if not fetched:  # a download and publish during the scrub goes through too
                assert kernels.Resolve(resolve_req(DEP_BOTTOM, 1), timeout=TIMEOUT).kernel.fetched
                fetched = True
            time.sleep(0.01)
    line = next(x for x in d.logs()[start:].splitlines() if "scrub: pass completed" in x)
    seconds = float(re.search(r"seconds=([\d.]+)", line).group(1))  # type: ignore[union-attr]
    nbytes = int(re.search(r" bytes=(\d+)", line).group(1))  # type: ignore[union-attr]
    print(
        f"scrub: {nbytes} bytes in {seconds:.2f}s at limit {rate >> 20} MiB/s; {calls} "
        f"resolves meanwhile, slowest {worst * 1e3:.1f} ms"
    )
    assert nbytes >= len(payload)
    assert nbytes / seconds <= rate * 1.1  # the limit holds...
    assert seconds >= 1.0
    assert calls >= 10 and worst < 0.5  # ...and serving went on at full speed
