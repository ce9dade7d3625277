"""The shipped Prometheus files (deploy/prometheus/) with the distribution's Prometheus: the
alert rules pass `promtool check rules` and their unit tests (`promtool test rules`: one test
per alert, each firing on its failure and quiet on a healthy series), every alert has a test
and names only metrics the daemon exports, the scrape configuration is valid, and a real
Prometheus on loopback scrapes a real daemon's metrics listener."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from scripts.reference.metrics import metric_names
from tests.support.daemon import DaemonProcess

PROMETHEUS_DIR = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "kerneld-alerts.yml"
RULE_TESTS = PROMETHEUS_DIR / "kerneld-alerts_test.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None or shutil.which("prometheus") is None,
    reason="needs the distribution's prometheus package (scripts/bootstrap installs it)",
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args],
        cwd=PROMETHEUS_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _alerts() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_rules_pass_promtool_check_and_unit_tests() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr
    config = _promtool("check", "config", "scrape.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_alert_is_unit_tested_and_uses_exported_metrics() -> None:
    alerts = _alerts()
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    firing = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert firing == set(alerts), f"alerts without a firing test: {set(alerts) - firing}"
    exported = set(metric_names())
    for name, expr in alerts.items():
        used = set(re.findall(r"\bkerneld_[a-z_]+", expr))
        assert used <= exported, f"{name} uses metrics kerneld does not export: {used - exported}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> subprocess.Popen[bytes]:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {"job_name": "kerneld", "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{_free_port()}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _query(api: str, expr: str) -> list[dict[str, object]]:
    url = f"{api}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        doc = json.load(answer)
    assert doc["status"] == "success", doc
    result: list[dict[str, object]] = doc["data"]["result"]
    return result


def _web_address(proc: subprocess.Popen[bytes]) -> str:
    listen = next(a for a in proc.args if str(a).startswith("--web.listen-address="))  # type: ignore[union-attr]
    return "http://" + str(listen).split("=", 1)[1]


def test_a_real_prometheus_scrapes_a_real_daemon(
    make_daemon: Callable[..., DaemonProcess],
    prometheus: Callable[[str], subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    listen = f"127.0.0.1:{_free_port()}"
    mirror = tmp_path / "mirror"  # an upstream that is never asked: no kernel is loaded here
    mirror.mkdir()
    daemon = make_daemon(
        mirror_dirs=[mirror],
        config={"metrics": {"listen": listen}, "prefetch": {"on_start": False}},
    )
    proc = prometheus(listen)
    api = _web_address(proc)
    deadline = time.monotonic() + 90
    found: list[dict[str, object]] = []
    last = ""
    while time.monotonic() < deadline and not found:
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
        try:
            found = _query(api, 'kerneld_ready{job="kerneld"} == 1')
        except OSError as exc:  # Prometheus still starting
            last = str(exc)
        if not found:
            time.sleep(0.5)
    assert found, f"Prometheus never saw kerneld_ready from {listen} ({last}):\n{daemon.logs()}"
    assert found[0]["metric"] == {  # type: ignore[comparison-overlap]
        "__name__": "kerneld_ready",
        "instance": listen,
        "job": "kerneld",
    }
    # The rules loaded, and a healthy daemon fires none of them.
    rules = json.load(urllib.request.urlopen(f"{api}/api/v1/rules", timeout=5))["data"]
    loaded = {r["name"] for g in rules["groups"] for r in g["rules"]}
    assert loaded == set(_alerts())
    assert _query(api, 'ALERTS{alertstate="firing"}') == []
