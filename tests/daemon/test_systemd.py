"""The systemd unit, sysusers and tmpfiles files, checked by systemd's own tools."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import REPO_ROOT

SYSTEMD = REPO_ROOT / "systemd"
UNIT = SYSTEMD / "kerneld.service"
MAX_EXPOSURE = 2.0

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def unit_for_checks(tmp_path: Path) -> Path:
    """The unit with ExecStart/ExecReload pointed at a kerneld and kerneldctl that exist here:
    `verify` requires every command to exist and be executable (the shipped unit says
    /usr/bin/kerneld and /usr/bin/kerneldctl)."""
    text = UNIT.read_text()
    for key, name, module in (
        ("ExecStart", "kerneld", "kerneld.server.main"),
        ("ExecReload", "kerneldctl", "kerneld.ctl.main"),
    ):
        binary = REPO_ROOT / ".venv" / "bin" / name
        if not binary.exists():
            binary = tmp_path / name
            binary.write_text(f'#!/bin/sh\nexec python3 -m {module} "$@"\n')
            binary.chmod(0o755)
        assert f"{key}=/usr/bin/{name} " in text, key
        text = text.replace(f"{key}=/usr/bin/{name} ", f"{key}={binary} ")
    target = tmp_path / "kerneld.service"
    target.write_text(text)
    return target


@needs_analyze
def test_unit_verifies_without_any_complaint(tmp_path: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit_for_checks(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 even on bad values: any output on stderr is a failure.
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_analyze
def test_unit_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a typo in a directive is reported on stderr."""
    unit = unit_for_checks(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectClock=yes", "ProtectClock=maybe"))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "Failed to parse boolean value" in result.stderr


@needs_analyze
def test_unit_exposure_score(tmp_path: Path) -> None:
    # systemd 252 refuses `--threshold=2.0`: it takes an integer in tenths of the printed score
    # (measured: a 1.5 unit passes --threshold=15 and fails --threshold=14), so 2.0 is 20.
    result = subprocess.run(
        [
            "systemd-analyze",
            "security",
            "--offline=yes",
            f"--threshold={round(MAX_EXPOSURE * 10)}",
            str(unit_for_checks(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    m = re.search(r"Overall exposure level for kerneld\.service: (\d+\.\d+)", result.stdout)
    assert m, result.stdout + result.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, result.stdout
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_keeps_what_gpu_detection_needs() -> None:
    directives = dict(
        line.split("=", 1) for line in UNIT.read_text().splitlines() if re.match(r"^\w+=", line)
    )
    assert directives["Type"] == "notify" and "WatchdogSec" in directives
    # A reload that reports back: `systemctl reload` fails when the daemon rejects the file.
    assert directives["ExecReload"].split()[:2] == ["/usr/bin/kerneldctl", "reload"]
    assert directives["User"] == "kerneld"
    assert "PrivateDevices" not in directives  # would hide /dev/nvidia*
    assert directives.get("ProcSubset", "all") == "all"  # pid would hide /proc/driver/nvidia
    for key in ("StateDirectory", "CacheDirectory", "RuntimeDirectory"):
        assert directives[key] == "kerneld"
    assert "kerneld-users" in directives["SupplementaryGroups"]
    assert "kerneld-admin" in directives["SupplementaryGroups"]


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="no systemd-sysusers")
def test_sysusers_and_tmpfiles_apply_to_an_image(tmp_path: Path) -> None:
    root = tmp_path / "image"
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        (root / "etc" / name).write_text("")
    sysusers = subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(SYSTEMD / "kerneld.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sysusers.returncode == 0, sysusers.stderr
    passwd = (root / "etc" / "passwd").read_text()
    groups = {
        line.split(":")[0]: line for line in (root / "etc" / "group").read_text().splitlines()
    }
    (user,) = [line for line in passwd.splitlines() if line.startswith("kerneld:")]
    assert user.split(":")[5] == "/var/lib/kerneld"
    # The fixed uid and gid the daemon image and the Kubernetes manifests use (deploy/).
    assert user.split(":")[2:4] == ["989", "989"]
    assert {"kerneld", "kerneld-users", "kerneld-admin"} <= set(groups)
    assert groups["kerneld-users"].endswith(":kerneld")
    assert groups["kerneld-admin"].endswith(":kerneld")

    tmpfiles = subprocess.run(
        ["systemd-tmpfiles", f"--root={root}", "--create", str(SYSTEMD / "kerneld.tmpfiles")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tmpfiles.returncode == 0, tmpfiles.stderr
    for rel, mode in (
        ("var/lib/kerneld", 0o755),
        ("var/cache/kerneld", 0o750),
        ("run/kerneld", 0o755),
        ("etc/kerneld", 0o755),
    ):
        assert (root / rel).is_dir() and (root / rel).stat().st_mode & 0o777 == mode, rel


@needs_analyze
def test_socket_unit_verifies_and_matches_the_user_socket(tmp_path: Path) -> None:
    """kerneld.socket: `systemd-analyze verify` is silent (with the service it names beside it),
    and its unix socket gets the user socket's mode and group (kerneld.toml's [sockets])."""
    unit_for_checks(tmp_path)
    socket_unit = tmp_path / "kerneld.socket"
    socket_unit.write_text((SYSTEMD / "kerneld.socket").read_text())
    result = subprocess.run(
        ["systemd-analyze", "verify", str(socket_unit), str(tmp_path / "kerneld.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    text = socket_unit.read_text()
    toml = (SYSTEMD / "kerneld.toml").read_text()
    assert 'user_mode = "0660"' in toml and 'user_group = "kerneld-users"' in toml
    for line in ("SocketUser=kerneld", "SocketGroup=kerneld-users", "SocketMode=0660",
                 "FileDescriptorName=hub-api", "ListenStream=127.0.0.1:848",
                 "ListenStream=/run/kerneld/hub-api.sock"):  # fmt: skip
        assert f"\n{line}\n" in text, line
    # the directory holding hub-api.sock must outlive a restart of the service
    assert "\nRuntimeDirectoryPreserve=yes\n" in UNIT.read_text()

    socket_unit.write_text(text.replace("SocketMode=0660", "SocketMode=0669"))
    broken = subprocess.run(
        ["systemd-analyze", "verify", str(socket_unit), str(tmp_path / "kerneld.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Failed to parse mode value" in broken.stderr, broken.stderr


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="no systemd-sysusers")
def test_sysusers_picks_a_free_uid_where_989_is_taken(tmp_path: Path) -> None:
    """As docs/containers.md ("One uid for the store") says: then the manifests need that uid."""
    root = tmp_path / "image"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("other:x:989:989::/:/usr/sbin/nologin\n")
    (root / "etc" / "group").write_text("other:x:989:\n")
    for name in ("shadow", "gshadow"):
        (root / "etc" / name).write_text("")
    done = subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(SYSTEMD / "kerneld.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Suggested user ID 989 for kerneld already used" in done.stderr
    (user,) = [
        line
        for line in (root / "etc" / "passwd").read_text().splitlines()
        if line.startswith("kerneld:")
    ]
    assert user.split(":")[2] != "989"
