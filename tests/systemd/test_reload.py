"""`kerneldctl reload`, the unit's `ExecReload=`: it reports what the daemon applied, and fails
with the daemon's reason when the daemon rejects the file, so `systemctl reload` fails too.
(test_install.py checks the same through a real systemd.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from grpc_health.v1 import health_pb2

from tests.support.ctl import run_ctl
from tests.support.daemon import DaemonProcess


def test_reload_applies_a_valid_file_and_refuses_an_invalid_one(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror])
    home = tmp_path / "home"
    sock = ("--admin-socket", str(d.admin_socket))

    same = run_ctl("reload", *sock, home=home)
    assert same.rc == 0 and same.stdout.startswith("configuration reloaded: "), same
    assert run_ctl("reload", "--json", *sock, home=home).json()["changed"] is False

    d.write_config({"resolve": {"ref_ttl": "7m"}})
    applied = run_ctl("reload", "--json", *sock, home=home)
    assert applied.rc == 0, applied
    doc = applied.json()
    assert doc["ok"] is True and doc["changed"] is True and "ref_ttl" in doc["detail"], doc

    d.write_config({"resolve": {"ref_ttl": "a while"}})
    refused = run_ctl("reload", *sock, home=home)
    assert refused.rc == 1, refused
    first, *rest = refused.stderr.splitlines()
    assert first.startswith("kerneldctl: error: configuration not reloaded: "), refused
    assert str(d.config_path) in first and "resolve.ref_ttl" in first and "a while" in first
    assert any(line.startswith("kerneldctl: hint: ") for line in rest), refused
    as_json = run_ctl("reload", "--json", *sock, home=home)
    assert as_json.rc == 1
    doc = as_json.json()
    assert doc["ok"] is False and doc["exit_code"] == 1 and "resolve.ref_ttl" in doc["error"]
    assert d.health() == health_pb2.HealthCheckResponse.SERVING
    # A refused reload is a warning (journald priority 4: `journalctl -p warning` shows it).
    failed = [line for line in d.logs().splitlines() if "ReloadConfig failed" in line]
    assert failed and all(" WARNING " in line for line in failed), failed

    # The running configuration was kept (ref_ttl 7m, not the default 5m): a file that says
    # 7m again changes nothing.
    d.write_config({"resolve": {"ref_ttl": "7m"}})
    back = run_ctl("reload", "--json", *sock, home=home)
    assert back.rc == 0 and back.json()["changed"] is False, back


def test_reload_without_a_daemon_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "admin.sock"
    result = run_ctl("reload", "--admin-socket", str(missing), home=tmp_path / "home")
    assert result.rc == 3 and "not running" in result.stderr, result
