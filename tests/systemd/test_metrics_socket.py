"""Who may scrape the metrics socket: `[metrics] socket_mode` and `socket_group`.

The system install's default (0660, group `kerneld-admin`) lets the admins run the docs'
`curl --unix-socket /run/kerneld/metrics.sock ...`; test_install.py checks that under a real
systemd, this module checks the settings themselves against a daemon running as the `kerneld`
user, with real other uids (no systemd needed, a few seconds).
"""

from __future__ import annotations

import errno
import grp
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from kerneld.config import ConfigError, default_config, dump_config, load_config, parse_config
from tests.daemon.rpc import connect_as, http_get_unix, metric
from tests.security.support import NOBODY, as_user
from tests.support.daemon import DaemonFailed, DaemonProcess, daemon_dir, default_user

ADMIN_GROUP = "kerneld-admin"

needs_unprivileged_daemon = pytest.mark.skipif(
    os.geteuid() != 0 or default_user() is None,
    reason="needs root, to run the daemon as the kerneld user and to play other users",
)


def _gid(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        pytest.skip(f"no group {name} (scripts/bootstrap creates it from systemd/kerneld.sysusers)")


def test_settings_and_defaults(tmp_path: Path) -> None:
    assert default_config(system=True).metrics_socket_group == ADMIN_GROUP
    assert default_config(system=True).metrics_socket_mode == 0o660
    assert default_config(system=False).metrics_socket_group == ""  # the daemon's own group
    cfg = parse_config(
        {"metrics": {"socket": "/run/m.sock", "socket_mode": "0640", "socket_group": "prom"}},
        source="t.toml",
        system=True,
    )
    assert (cfg.metrics_socket_mode, cfg.metrics_socket_group) == (0o640, "prom")
    # --check-config's output reads back to the same values
    path = tmp_path / "k.toml"
    path.write_text(dump_config(cfg))
    again = load_config(path, env={}, system=True)
    assert (again.metrics_socket_mode, again.metrics_socket_group) == (0o640, "prom")
    for bad, key in (
        ({"socket_mode": "rw"}, "metrics.socket_mode"),
        ({"socket_mode": "0999"}, "metrics.socket_mode"),
        ({"socket_group": 7}, "metrics.socket_group"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config({"metrics": bad}, source="t.toml", system=True)
        assert err.value.key == key


@needs_unprivileged_daemon
def test_group_members_may_scrape_others_may_not(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    admin_gid = _gid(ADMIN_GROUP)
    path = daemon_dir("kd-m-") / "metrics.sock"
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={"metrics": {"socket": str(path), "socket_group": ADMIN_GROUP}},
    )
    st = os.stat(path)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, admin_gid)
    assert st.st_uid != 0  # the daemon is not root: it may give the socket only to its groups

    # nobody, once as a member of kerneld-admin, once in no group at all
    text = as_user(NOBODY.pw_uid, admin_gid, lambda: http_get_unix(path))
    assert metric(text, "kerneld_ready") == 1
    assert connect_as(path, NOBODY.pw_uid, NOBODY.pw_gid) == errno.EACCES

    # a tighter mode shuts the group out too (applied at the next start, like the socket)
    d.stop()
    d.write_config({"metrics": {"socket_mode": "0600"}})
    d.start()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert connect_as(path, NOBODY.pw_uid, admin_gid) == errno.EACCES


@needs_unprivileged_daemon
def test_a_group_the_daemon_is_not_in_stops_it_with_the_reason(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    path = daemon_dir("kd-m-") / "metrics.sock"
    d = make_daemon(
        mirror_dirs=[kernel_mirror],
        config={"metrics": {"socket": str(path), "socket_group": "root"}},
        start=False,
    )
    with pytest.raises(DaemonFailed) as failed:
        d.start()
    assert d.returncode == 2, failed.value  # a configuration problem
    message = str(failed.value)
    assert str(path) in message and "'root'" in message and "SupplementaryGroups" in message
    assert not path.exists()  # nothing left bound
