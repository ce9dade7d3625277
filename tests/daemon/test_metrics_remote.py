"""A Prometheus on another host scrapes the metrics listener configured as the docs say, and
nothing off this host reaches it otherwise.

The daemon runs in a network namespace of its own (tests/support/netns.py), joined to a second
one, "another host", by a veth pair: a scrape from there comes from a non-loopback address
over a real interface, which is what `[metrics] allow_remote` is for (the DaemonSet's
ConfigMap and deploy/prometheus/scrape.yml: `listen = "0.0.0.0:9464"`, `allow_remote = true`).
Checked, with the real daemon as its user:

- that configuration, read from deploy/kubernetes/kerneld-daemonset.yaml: the other host's
  scrape gets the metrics (counted as the one remote scraper), and the distribution's
  Prometheus there, with deploy/prometheus/scrape.yml's job (its targets this daemon's
  address), has the target up and `kerneld_ready` 1;
- no `[metrics]` (the default): nothing listens on TCP; the other host is refused;
- `listen = "127.0.0.1:9464"` (a loopback listener, allowed without `allow_remote`): the daemon's
  own host scrapes it, the other host is refused;
- `0.0.0.0:9464` without `allow_remote`: the daemon refuses to start and names the setting.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon.rpc import metric
from tests.daemon.test_import_only import _inet_sockets
from tests.support.daemon import REPO_ROOT, DaemonFailed
from tests.support.netns import SERVER_ADDR, HostPair, NetnsDaemon

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DAEMONSET = REPO_ROOT / "deploy" / "kubernetes" / "kerneld-daemonset.yaml"
SCRAPE_CONFIG = REPO_ROOT / "deploy" / "prometheus" / "scrape.yml"
#: GET /metrics from inside a namespace: the status and body, or why no answer came.
SCRAPE = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as answer:
        print(answer.status); print(answer.read().decode())
except OSError as exc:
    print(f"no answer: {exc}")
"""


def documented_metrics() -> dict[str, Any]:
    """The `[metrics]` table of the DaemonSet's ConfigMap, as shipped."""
    docs = {d["kind"]: d for d in yaml.safe_load_all(DAEMONSET.read_text(encoding="utf-8"))}
    table: dict[str, Any] = tomllib.loads(docs["ConfigMap"]["data"]["kerneld.toml"])["metrics"]
    return table


def scrape(net: HostPair, ns: str, host: str, port: int) -> str:
    return scrape_url(net, ns, f"http://{host}:{port}/metrics")


def scrape_url(net: HostPair, ns: str, url: str) -> str:
    done = net.run(ns, [sys.executable, "-c", SCRAPE, url])
    assert done.returncode == 0, done.stderr
    return done.stdout


def prometheus_sees(net: HostPair, job: dict[str, Any], target: str, tmp: Path) -> str:
    """Run the distribution's Prometheus in the client namespace with `job` (scrape.yml's,
    every second, `target` its only one) until it has scraped `target` up; what it reports."""
    config = tmp / "prometheus.yml"
    job = {**job, "scrape_interval": "1s", "static_configs": [{"targets": [target]}]}
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    log = (tmp / "prometheus.log").open("wb")
    argv = ["ip", "netns", "exec", net.client, "prometheus", f"--config.file={config}"]
    argv += [f"--storage.tsdb.path={tmp / 'tsdb'}", "--web.listen-address=127.0.0.1:9090"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    query = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode(
        {"query": f'up{{job="{job["job_name"]}"}} == 1 and on(instance) kerneld_ready == 1'}
    )
    answer = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            answer = scrape_url(net, net.client, query)
            if answer.startswith("200\n") and target in answer:
                return answer
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    raise AssertionError(f"Prometheus never had {target} up: {answer}\n{log.name}")


def listening(d: NetnsDaemon) -> list[str]:
    """The daemon's TCP sockets in state LISTEN (0A), as `table local`."""
    return [s for s in _inet_sockets(d.pid) if s.startswith("tcp") and s.endswith(":0000")]


def test_another_host_scrapes_as_documented_and_nothing_else_reaches_metrics(
    tmp_path: Path,
) -> None:
    documented = documented_metrics()
    assert documented == {"listen": "0.0.0.0:9464", "allow_remote": True}, documented
    port = int(documented["listen"].rpartition(":")[2])
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]
    targets = [t for c in job["static_configs"] for t in c["targets"]]
    assert targets and all(t.endswith(f":{port}") for t in targets), targets  # the same port
    with HostPair() as net:
        d = NetnsDaemon(
            tmp_path / "d",
            netns=net.server,
            config={"upstream": [], "metrics": documented, "prefetch": {"on_start": False}},
        )
        with d:
            # As documented: the other host's scrape is answered.
            got = scrape(net, net.client, SERVER_ADDR, port)
            status, _, body = got.partition("\n")
            assert status == "200", got
            assert metric(body, "kerneld_ready") == 1, body[:2000]
            assert f"metrics on http://0.0.0.0:{port}/metrics" in d.logs()
            if shutil.which("prometheus"):  # scripts/bootstrap installs it
                seen = prometheus_sees(net, job, f"{SERVER_ADDR}:{port}", tmp_path)
                assert json.loads(seen.partition("\n")[2])["data"]["result"], seen

            # The default: no [metrics]; nothing listens on TCP, the other host is refused.
            d.stop()
            d.config.pop("metrics")
            d.write_config()
            d.start()
            assert listening(d) == [], listening(d)
            assert "Connection refused" in scrape(net, net.client, SERVER_ADDR, port)

            # A loopback listener: this host scrapes it, the other one is refused.
            d.stop()
            d.write_config({"metrics": {"listen": f"127.0.0.1:{port}"}})
            d.start()
            assert scrape(net, net.server, "127.0.0.1", port).startswith("200\n")
            assert "Connection refused" in scrape(net, net.client, SERVER_ADDR, port)

            # Off loopback without allow_remote: refused at start, naming the setting.
            d.stop()
            d.write_config({"metrics": {"listen": documented["listen"], "allow_remote": False}})
            with pytest.raises(DaemonFailed) as failed:
                d.start()
            assert d.returncode == 2 and "allow_remote = true" in str(failed.value), failed.value
