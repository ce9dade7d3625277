"""A store the daemon may not write because of a read-only *mount* (what kerneld.service's
ProtectSystem=strict makes of a path outside its ReadWritePaths=) is told apart from a read-only
*file system* (a disk error), on real mounts: the start's error names the mount and the fix, not
`dmesg`. And the unit's sandbox as `systemctl show` reports it decides what `--check-config`
refuses (tests/systemd/test_store_ops.py runs that under a real systemd)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kerneld.server.plumbing.sandbox import Sandbox, readonly_by_sandbox
from tests.support.daemon import DaemonFailed, DaemonProcess, account, default_user


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mount {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8)")
    made: list[Path] = []

    def make(kind: str) -> Path:
        """A directory for the store: "bind-ro" (writable file system, read-only mount) or
        "fs-ro" (a file system that is itself read-only)."""
        target = tmp_path / kind
        target.mkdir()
        if kind == "bind-ro":
            source = tmp_path / "disk"
            (source / "store").mkdir(parents=True)  # an empty store, the daemon's own
            user = default_user()
            if user is not None:
                pw = account(user)
                for path in (source, source / "store"):
                    os.chown(path, pw.pw_uid, pw.pw_gid)
            _mount("--bind", str(source), str(target))
            made.append(target)
            _mount("-o", "remount,bind,ro", str(target))
        else:
            _mount("-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target))
            made.append(target)
        return target

    yield make
    for target in reversed(made):
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_read_only_mount_of_a_writable_fs_is_named(mounts: Callable[..., Path]) -> None:
    bind = mounts("bind-ro")
    why = readonly_by_sandbox(bind / "store")
    assert why is not None and f"mounts {bind} read-only" in why, why
    # A file system that is read-only itself is a disk matter: no sandbox to blame.
    assert readonly_by_sandbox(mounts("fs-ro") / "store") is None
    # A writable place is not read-only at all.
    assert readonly_by_sandbox(bind.parent / "elsewhere") is None
    assert readonly_by_sandbox(bind / "store" / "v1") is not None  # below the mount too


def test_the_daemon_blames_the_mount_not_the_disk(
    mounts: Callable[..., Path], make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    bind = mounts("bind-ro")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    daemon = make_daemon(store=bind / "store", mirror_dirs=[mirror], start=False)
    with pytest.raises(DaemonFailed):
        daemon.start()
    logs = daemon.logs()
    assert "Read-only file system" in logs and f"mounts {bind} read-only" in logs, logs
    assert "dmesg" not in logs, logs


def test_check_config_refuses_what_the_units_sandbox_makes_read_only() -> None:
    unit = Sandbox.from_properties(
        {
            "ProtectSystem": "strict",
            "ProtectHome": "yes",
            "PrivateTmp": "yes",
            "StateDirectory": "kerneld",
            "CacheDirectory": "kerneld",
            "RuntimeDirectory": "kerneld",
            "ReadWritePaths": "-/data/kerneld/store /srv/k",
        }
    )
    assert unit.refusal(Path("/var/lib/kerneld/store")) is None
    assert unit.refusal(Path("/data/kerneld/store")) is None
    assert unit.refusal(Path("/srv/k/store")) is None
    moved = unit.refusal(Path("/data2/kerneld/store"))
    assert moved is not None and "ReadWritePaths=/data2/kerneld/store" in moved
    assert "systemctl edit kerneld" in moved and "ProtectSystem=strict" in moved
    home = unit.refusal(Path("/home/alice/store"))
    assert home is not None and "ProtectHome=yes" in home
    tmp = unit.refusal(Path("/tmp/store"))
    assert tmp is not None and "PrivateTmp" in tmp
    # No sandbox: nothing to refuse.
    assert Sandbox.from_properties({}).refusal(Path("/data2/kerneld/store")) is None
