"""The admin workflow of issue 16, point by point, as an admin (and a kerneld-users member, and a
user in no group) meets it: key hints that work on the shipped kerneld.toml, `status` without
the admin socket and with upstreams not yet contacted, `gc --target-free` that cannot be met,
`--check-config` durations, reload log lines, `verify --repair` exit codes, socket defaults and
the client's group hint. Other users are real uids (setpriv), never mocks."""

from __future__ import annotations

import grp
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from pathlib import Path

import pytest

from kerneld.config import FIELD_KEYS, Config, ConfigError, dump_config, load_config
from kerneld.mirror.keys import generate_key
from tests.fixtures_daemon import ACT
from tests.security.support import CPU_FACTS, NOBODY, needs_root, public_dir
from tests.support.ctl import KERNELDCTL, Result, ctl_env, run_ctl
from tests.support.daemon import REPO_ROOT, DaemonProcess, clean_env

SHIPPED = REPO_ROOT / "systemd" / "kerneld.toml"
ROOT = os.geteuid() == 0
#: The documented system-mode socket permissions (only root can hand sockets to these groups).
SOCKETS = {
    "sockets": {
        "user_mode": "0660",
        "user_group": "kerneld-users",
        "admin_mode": "0660",
        "admin_group": "kerneld-admin",
    }
}


def ctl(daemon: DaemonProcess, home: Path, *args: str) -> Result:
    env = {
        "KERNELD_ADMIN_SOCKET": str(daemon.admin_socket),
        "KERNELD_SOCKET": str(daemon.user_socket),
    }
    return run_ctl(*args, home=home, env=env)


@pytest.fixture
def shared_home() -> Iterator[Path]:
    """A HOME every user may use (pytest's tmp dirs are 0700)."""
    with public_dir("kd-ctl-") as base:
        home = base / "home"
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        yield home


def as_nobody(
    *args: str, home: Path, groups: tuple[str, ...] = (), env: Mapping[str, str] | None = None
) -> Result:
    """Run a command as `nobody`, with exactly `groups` as supplementary groups."""
    ids = ",".join(str(grp.getgrnam(g).gr_gid) for g in groups)
    who = [
        "setpriv",
        f"--reuid={NOBODY.pw_uid}",
        f"--regid={NOBODY.pw_gid}",
        f"--groups={ids}" if ids else "--clear-groups",
    ]
    environ = ctl_env(home, env)
    for sub in ("run", "config", "cache", "hf"):
        (home / sub).mkdir(exist_ok=True)
        (home / sub).chmod(0o777)
    proc = subprocess.run([*who, *args], capture_output=True, text=True, env=environ, timeout=60)
    return Result(proc.returncode, proc.stdout, proc.stderr)


# ---- §3.4 keys --------------------------------------------------------------------------------


def _hinted_setting(stdout: str) -> str:
    """The line `key generate` says to put in place of the shipped `trusted_keys = {}`."""
    lines = stdout.splitlines()
    at = lines.index("  trusted_keys = {}")
    assert lines[at - 1].endswith("replace the line") and lines[at + 1] == "with", stdout
    return lines[at + 2].strip()


def test_key_generate_hint_works_on_the_shipped_config(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    first = run_ctl("key", "generate", "site-1", "--key-dir", str(keys), home=tmp_path / "h")
    assert first.rc == 0, first.stderr
    setting = _hinted_setting(first.stdout)
    public = (keys / "site-1.pub").read_text().strip()
    shipped = SHIPPED.read_text(encoding="utf-8")
    assert shipped.splitlines().count("trusted_keys = {}") == 1

    # The old hint (a [mirror.trusted_keys] table) cannot work with the shipped file.
    old = tmp_path / "old.toml"
    old.write_text(shipped + f'\n[mirror.trusted_keys]\nsite-1 = "{public}"\n')
    with pytest.raises(ConfigError):
        load_config(old, env={})

    # Followed literally: replace the line.
    edited = tmp_path / "kerneld.toml"
    text = shipped.replace("\ntrusted_keys = {}\n", f"\n{setting}\n")
    edited.write_text(text, encoding="utf-8")
    assert dict(load_config(edited, env={}).trusted_keys) == {"site-1": public}

    # A second key (a name with '.', which a bare TOML key would nest): "inside its braces,
    # after a comma".
    second = run_ctl(
        "key", "generate", "site.2", "--key-dir", str(keys), "--json", home=tmp_path / "h"
    )
    assert second.rc == 0, second.stderr
    entry = second.json()["trusted_keys_line"]
    assert second.json()["trusted_keys_setting"] == f"trusted_keys = {{ {entry} }}"
    line = next(x for x in text.splitlines() if x.startswith("trusted_keys = {"))
    added = line[: line.rindex("}")].rstrip() + ", " + entry + " }"
    edited.write_text(text.replace(line, added), encoding="utf-8")
    trusted = dict(load_config(edited, env={}).trusted_keys)
    assert trusted == {"site-1": public, "site.2": second.json()["public_key"]}


@needs_root
def test_key_public_unreadable_is_a_clear_error(shared_home: Path) -> None:
    """On a system install the key directory is the daemon user's, mode 0700: an admin who is
    not that user gets an error and a hint, exit 5, never a traceback."""
    with public_dir() as base:
        keys = base / "keys"
        generate_key("site-1", keys)  # 0700, root's
        r = as_nobody(
            KERNELDCTL,
            "key",
            "public",
            "site-1",
            "--key-dir",
            str(keys),
            home=shared_home,
            groups=("kerneld-admin",),
        )
        assert r.rc == 5, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert f"cannot read key 'site-1' in {keys}: Permission denied" in r.stderr
        assert "runuser -u kerneld -- kerneldctl key public site-1" in r.stderr
        # the owner reads it
        ok = run_ctl("key", "public", "site-1", "--key-dir", str(keys), home=shared_home)
        assert ok.rc == 0 and ok.stdout.startswith("ed25519:"), ok.stderr


# ---- §3.7 status ------------------------------------------------------------------------------


def test_status_upstream_not_contacted_then_reachable(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    home = tmp_path / "home"
    before = ctl(daemon, home, "status", "--json")
    assert before.rc == 0, before.stderr
    (up,) = before.json()["upstreams"]
    assert up["state"] == "not yet contacted" and up["reachable"] is None
    human = ctl(daemon, home, "status")
    assert "not yet contacted" in human.stdout and "reachable" not in human.stdout

    assert ctl(daemon, home, "prefetch", f"{ACT}:1", "--variants", "torch-universal").rc == 0
    (up,) = ctl(daemon, home, "status", "--json").json()["upstreams"]
    assert up["state"] == "reachable" and up["reachable"] is True and up["last_success"]
    assert "reachable (last answer" in ctl(daemon, home, "status").stdout


@needs_root
def test_status_as_a_kerneld_users_member_and_as_nobody(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, shared_home: Path
) -> None:
    """GetStatus is on the user socket: a kerneld-users member gets it (without the admin-only
    part, and told so); a user in no group gets exit 5 (not 3: the daemon runs)."""
    daemon = make_daemon(mirror_dirs=[kernel_mirror], config=SOCKETS)
    env = {
        "KERNELD_ADMIN_SOCKET": str(daemon.admin_socket),
        "KERNELD_SOCKET": str(daemon.user_socket),
    }
    member = as_nobody(
        KERNELDCTL, "status", "--json", home=shared_home, groups=("kerneld-users",), env=env
    )
    assert member.rc == 0, member.stderr
    doc = member.json()
    assert (
        doc["ready"] is True and doc["admin"] is False and doc["socket"] == str(daemon.user_socket)
    )
    assert doc["store_root"] == str(daemon.store_root) and "pins" not in doc
    assert "kerneld-admin" in doc["admin_detail"]
    human = as_nobody(KERNELDCTL, "status", home=shared_home, groups=("kerneld-users",), env=env)
    assert human.rc == 0 and "ready" in human.stdout
    assert "pins, denies, leases and refs: need the admin socket" in human.stdout

    stranger = as_nobody(KERNELDCTL, "status", home=shared_home, env=env)
    assert stranger.rc == 5, (stranger.stdout, stranger.stderr)
    assert "permission denied" in stranger.stderr and "kerneld-users" in stranger.stderr
    gc = as_nobody(KERNELDCTL, "gc", "--json", home=shared_home, env=env)
    assert gc.rc == 5 and gc.json()["exit_code"] == 5 and "kerneld-admin" in gc.stderr

    admin = as_nobody(
        KERNELDCTL, "status", "--json", home=shared_home, groups=("kerneld-admin",), env=env
    )
    assert admin.rc == 0 and admin.json()["admin"] is True and "pins" in admin.json()


@needs_root
def test_lock_against_the_daemon_as_an_admin_who_cannot_read_the_store(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, shared_home: Path
) -> None:
    """README's admin quick start: `kerneldctl lock . --source daemon` by a kerneld-admin
    member outside kerneld-users (the store's group): the dependencies come over the admin
    socket, read by the daemon, not from metadata.json files the admin may not open."""
    from kerneld_client.lockfile import parse_lockfile
    from tests.fixtures_daemon import C1, DEP_BOTTOM, DEP_TOP

    daemon = make_daemon(mirror_dirs=[kernel_mirror], config=SOCKETS)
    env = {"KERNELD_ADMIN_SOCKET": str(daemon.admin_socket)}
    assert ctl(daemon, shared_home.parent / "root-home", "prefetch", f"{DEP_TOP}:1").rc == 0
    project = shared_home.parent / "project"
    project.mkdir(mode=0o777)
    project.chmod(0o777)
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{DEP_TOP}" = 1\n')
    cannot = as_nobody("ls", str(daemon.store_root), home=shared_home, groups=("kerneld-admin",))
    assert "Permission denied" in cannot.stderr, "the admin may read the store: proves nothing"
    locked = as_nobody(
        KERNELDCTL,
        "lock",
        str(project),
        "--source",
        "daemon",
        home=shared_home,
        groups=("kerneld-admin",),
        env=env,
    )
    assert locked.rc == 0, locked.stdout + locked.stderr
    locks = parse_lockfile((project / "kernels.lock").read_bytes()).locks
    assert {(x.dependency.repo_id, x.dependency.ref, x.commit) for x in locks} == {
        (DEP_TOP, "v1", C1),
        (DEP_BOTTOM, "v1", C1),
    }


# ---- §3.9 gc ----------------------------------------------------------------------------------


def test_gc_target_free_that_cannot_be_met_says_why(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    home = tmp_path / "home"
    assert ctl(daemon, home, "prefetch", f"{ACT}:1", "--variants", "all").rc == 0
    assert ctl(daemon, home, "pin", f"{ACT}:1").rc == 0
    sizes = {
        v["tree_digest"]: int(v["size_bytes"])
        for k in ctl(daemon, home, "ls", "--json").json()["kernels"]
        for r in k["revisions"]
        for v in r["variants"]
    }
    assert len(sizes) == 2 and all(sizes.values())

    r = ctl(daemon, home, "gc", "--target-free", str(10**15), "--json")
    assert r.rc == 6, (r.stdout, r.stderr)
    doc = r.json()
    assert doc["target_reached"] is False and doc["target_free_bytes"] == 10**15
    assert {k["tree_digest"]: int(k["size_bytes"]) for k in doc["kept"]} == sizes
    assert doc["kept_by_reason"] == {"pinned": {"trees": 2, "size_bytes": sum(sizes.values())}}
    assert "target not reached" in r.stderr and "2 pinned" in r.stderr

    human = ctl(daemon, home, "gc", "--target-free", "1000TB", "--dry-run")  # the same size
    assert human.rc == 6 and "would free 0 B" in human.stdout and "2 pinned" in human.stdout
    assert "of the 909.5 TiB asked" in human.stderr, human.stderr
    bad = ctl(daemon, home, "gc", "--target-free", "lots")
    assert bad.rc == 2 and "like 20GiB, 500MB or a byte count" in bad.stderr, bad

    assert ctl(daemon, home, "unpin", f"{ACT}:1").rc == 0
    met = ctl(daemon, home, "gc", "--target-free", "1", "--json")
    assert met.rc == 0, met.stderr
    assert met.json()["target_reached"] is True and int(met.json()["freed_bytes"]) >= 1


# ---- §3.13 deny ------------------------------------------------------------------------------


def test_after_deny_get_kernel_raises_or_returns_its_fallback(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    """What README says after `kerneldctl deny`: get_kernel raises KernelDenied (a
    FileNotFoundError), or returns `fallback=` when given; `allow` makes it load again."""
    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    home = tmp_path / "home"
    assert ctl(daemon, home, "prefetch", f"{ACT}:1", "--variants", "torch-universal").rc == 0
    assert ctl(daemon, home, "deny", ACT, "--reason", "bad build").rc == 0
    code = f"""
import json, warnings
import kerneld_client
out = {{}}
try:
    kerneld_client.get_kernel("{ACT}", version=1)
except kerneld_client.KernelDenied as exc:
    out["raised"] = [str(exc), isinstance(exc, FileNotFoundError)]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    out["fallback"] = kerneld_client.get_kernel("{ACT}", version=1, fallback="pytorch")
out["warned"] = [str(w.message) for w in seen]
print(json.dumps(out))
"""
    env = clean_env(
        {
            "HOME": str(home),
            "KERNELD_SOCKET": str(daemon.user_socket),
            "KERNELD_PLATFORM_JSON": CPU_FACTS,
        }
    )
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "bad build" in out["raised"][0] and out["raised"][1] is True
    assert out["fallback"] == "pytorch" and any("bad build" in w for w in out["warned"])


# ---- §3.14 check-config, reload, verify --repair ----------------------------------------------


def test_check_config_prints_durations_as_the_config_takes_them(tmp_path: Path) -> None:
    config = tmp_path / "kerneld.toml"
    config.write_text(
        '[resolve]\nref_ttl = "1h"\nnegative_ttl = 0.25\n[store]\ncap = "20GiB"\n'
        '[server]\ndrain_timeout = "1m30s"\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "kerneld.server.main", "--check-config", "--config", str(config)],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    for line in ('ref_ttl = "1h"', 'negative_ttl = "250ms"', 'cap = "20GiB"'):
        assert line in r.stdout.splitlines()
    assert 'drain_timeout = "1m30s"' in r.stdout and 'lease_max = "1d"' in r.stdout
    assert not re.search(r"^\w+ = \d+\.\d+$", r.stdout, re.M), r.stdout
    dumped = tmp_path / "dumped.toml"
    dumped.write_text(r.stdout)
    again = load_config(dumped, env={})
    first = load_config(config, env={})
    assert {**again.__dict__, "source": ""} == {**first.__dict__, "source": ""}
    assert dump_config(again).splitlines()[1:] == dump_config(first).splitlines()[1:]


def test_every_config_field_has_its_kerneld_toml_name() -> None:
    assert {f.name for f in fields(Config)} <= set(FIELD_KEYS)


def test_reload_logs_the_config_key_names(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    daemon.write_config({"resolve": {"ref_ttl": "1h"}, "server": {"threads": 4}})
    daemon.send_signal(signal.SIGHUP)
    line = daemon.wait_for_log("config reloaded from")
    assert "applied: [resolve] ref_ttl" in line, line
    assert "needs a restart: [server] threads" in line, line
    assert "ref_ttl_s" not in daemon.logs()


def test_verify_repair_exits_0_when_everything_was_repaired(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    daemon = make_daemon(mirror_dirs=[kernel_mirror])
    home = tmp_path / "home"
    assert ctl(daemon, home, "prefetch", f"{ACT}:1", "--variants", "torch-universal").rc == 0
    blob = next(p for p in (daemon.store_root / "v1" / "blobs").rglob("*") if p.is_file())
    mode = blob.stat().st_mode & 0o7777
    blob.chmod(0o644)
    blob.write_bytes(b"not what was published\n")
    blob.chmod(mode)
    found = ctl(daemon, home, "verify", "--json")
    assert found.rc == 1 and found.json()["exit_mask"] == 1, found.stdout

    fixed = ctl(daemon, home, "verify", "--repair", "--json")
    assert fixed.rc == 0, (fixed.stdout, fixed.stderr)
    doc = fixed.json()
    assert doc["found_mask"] == 1 and doc["exit_mask"] == 0 and doc["remaining"] == []
    assert doc["repaired"] and doc["problems"]
    human = ctl(daemon, home, "verify")
    assert human.rc == 0 and "clean" in human.stdout


# ---- §3.11 socket defaults and the client's group hint ----------------------------------------


@pytest.mark.skipif(
    not ROOT or Path("/run/kerneld").exists(), reason="needs root and no system daemon here"
)
def test_root_means_the_system_daemon_when_it_is_stopped(tmp_path: Path) -> None:
    r = run_ctl("status", home=tmp_path / "home")
    assert r.rc == 3, r.stderr
    assert "no admin socket at /run/kerneld/admin.sock" in r.stderr
    assert "systemctl start kerneld" in r.stderr
    assert ".cache" not in r.stderr and str(tmp_path) not in r.stderr


@needs_root
@pytest.mark.skipif(
    Path("/etc/kerneld/kerneld.toml").exists() or Path("/var/lib/kerneld/store").exists(),
    reason="a system install exists here: its sockets are what every user means",
)
def test_an_ordinary_user_without_a_system_install_means_their_own(shared_home: Path) -> None:
    r = as_nobody(KERNELDCTL, "status", home=shared_home)
    assert r.rc == 3, r.stderr
    assert f"no admin socket at {shared_home / 'run' / 'kerneld' / 'admin.sock'}" in r.stderr


def _refused_socket_error(shared_home: Path, **env: str) -> tuple[Path, int, str]:
    """(socket, its gid, the client's error) for `nobody` loading through a socket it may not
    connect to (0600, root's), with `env` added to the job's environment."""
    with public_dir() as base:
        path = base / "kerneld.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)
        path.chmod(0o600)
        gid = path.stat().st_gid
        code = (
            "import json, kerneld_client\n"
            "try:\n"
            "    kerneld_client.get_kernel('org/k', version=1, policy='error')\n"
            "except kerneld_client.DaemonUnavailable as exc:\n"
            "    print(json.dumps({'error': str(exc)}))\n"
        )
        try:
            r = as_nobody(
                sys.executable,
                "-c",
                code,
                home=shared_home,
                env={
                    "KERNELD_SOCKET": str(path),
                    "KERNELD_STORE": str(base / "no-store"),
                    "KERNELD_PLATFORM_JSON": CPU_FACTS,
                    **env,
                },
            )
        finally:
            server.close()
    assert r.rc == 0, r.stderr
    return path, gid, json.loads(r.stdout.strip().splitlines()[-1])["error"]


@needs_root
def test_client_hint_names_the_kerneld_users_group(shared_home: Path) -> None:
    """A socket this user may not connect to: the client names the group that grants it."""
    path, _, error = _refused_socket_error(shared_home)
    assert f"no permission to connect to {path}" in error
    assert "kerneld-users" in error and "kerneld group" not in error


@needs_root
def test_client_hint_in_a_pod_names_supplemental_groups(shared_home: Path) -> None:
    """In a Kubernetes pod usermod cannot help: the hint names the pod spec's
    supplementalGroups and the socket's own gid."""
    # KUBERNETES_SERVICE_HOST: what the kubelet sets in a pod.
    path, gid, error = _refused_socket_error(shared_home, KUBERNETES_SERVICE_HOST="10.96.0.1")
    assert f"no permission to connect to {path}" in error
    assert f"supplementalGroups: [{gid}]" in error and "usermod" not in error, error
