"""`kerneldctl mirror export` through a daemon that runs as another, unprivileged user (issue 16
§3.2): the daemon streams the files and the admin's own kerneldctl writes them, where only the
admin may write, atomically; the bundle imports back and verifies.

Three real users: root starts things, the daemon is the system user `kerneld` (as in the unit),
and the admin running kerneldctl is `nobody` in the `kerneld-admin` group, exporting into a
directory that only `nobody` may write.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.mirror.destination import ExportError
from kerneld.mirror.documents import blob_path
from kerneld.mirror.keys import generate_key
from kerneld.mirror.receive import ExportReceiver
from tests.fixtures_daemon import ACT, C1
from tests.security.support import as_user, needs_root
from tests.support.ctl import KERNELDCTL, Result, ctl_env, run_ctl
from tests.support.daemon import DaemonProcess, account, grant_traversal, hand_over

ADMIN_SOCKETS = {"admin_mode": "0660", "admin_group": "kerneld-admin"}


class Site:
    def __init__(self, base: Path, mirror: Path) -> None:
        self.base = base
        self.daemon = DaemonProcess(
            base / "d", mirror_dirs=[mirror], config={"sockets": ADMIN_SOCKETS}
        )
        assert self.daemon.user is not None, "the test daemon runs as an unprivileged user"
        self.daemon_pw = account(self.daemon.user)
        self.admin = pwd.getpwnam("nobody")
        assert self.admin.pw_uid != self.daemon_pw.pw_uid
        self.home = base / "admin-home"
        self.home.mkdir()
        grant_traversal(self.home / "x")
        # the admin's own signing key, which the daemon's user cannot read
        self.keys = self.home / "keys"
        self.key = generate_key("site-1", self.keys)
        hand_over(self.home, self.admin.pw_uid, self.admin.pw_gid)

    def ctl_as_admin(self, *args: str) -> Result:
        """kerneldctl as `nobody` + kerneld-admin: an admin who is neither root nor the daemon."""
        env = ctl_env(
            self.home,
            {
                "KERNELD_ADMIN_SOCKET": str(self.daemon.admin_socket),
                "KERNELD_KEY_DIR": str(self.keys),
            },
        )
        proc = subprocess.run(
            [KERNELDCTL, *args],
            user=self.admin.pw_uid,
            group=self.admin.pw_gid,
            extra_groups=[grp.getgrnam("kerneld-admin").gr_gid],
            env=env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, kernel_mirror: Path) -> Iterator[Site]:
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")
    s = Site(tmp_path_factory.mktemp("export-as-caller"), kernel_mirror)
    with s.daemon:
        assert (
            run_ctl(
                "prefetch",
                f"{ACT}:1",
                "--variants",
                "all",
                home=s.base / "root-home",
                env={"KERNELD_ADMIN_SOCKET": str(s.daemon.admin_socket)},
            ).rc
            == 0
        )
        yield s


def _private_dir(site: Site, name: str) -> Path:
    """A directory only the admin (nobody) may write: 0700, owned by nobody."""
    d = site.home / name
    d.mkdir()
    os.chown(d, site.admin.pw_uid, site.admin.pw_gid)
    d.chmod(0o700)
    return d


def _writable_by(path: Path, uid: int, gid: int) -> bool:
    return bool(as_user(uid, gid, lambda: os.access(path, os.W_OK)))


@needs_root
def test_export_is_written_by_the_admin_where_only_the_admin_may_write(
    site: Site, tmp_path: Path
) -> None:
    out_dir = _private_dir(site, "export")
    # The premise: the daemon's user could not have written this destination itself.
    assert not _writable_by(out_dir, site.daemon_pw.pw_uid, site.daemon_pw.pw_gid)
    assert _writable_by(out_dir, site.admin.pw_uid, site.admin.pw_gid)

    out = out_dir / "kernels.tar"
    r = site.ctl_as_admin(
        "mirror", "export", "--to", str(out), f"{ACT}:1", "--sign-key", "site-1", "--json"
    )
    assert r.rc == 0, r.stdout + r.stderr
    assert r.json()["kernels"] == [{"repo_id": ACT, "commit": C1}]
    st = out.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (site.admin.pw_uid, 0o644)
    assert sorted(p.name for p in out_dir.iterdir()) == ["kernels.tar"]  # no staging left
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert "mirror-info" in names and any(n.endswith(".json.sig") for n in names)

    # It imports back into a fresh store (signature checked) and verifies.
    store = tmp_path / "airgap-store"
    imported = run_ctl(
        "mirror",
        "import",
        "--store",
        str(store),
        "--from",
        str(out),
        "--trust",
        f"site-1={site.key.public}",
        "--json",
        home=tmp_path / "h",
    )
    assert imported.rc == 0, imported.stdout + imported.stderr
    assert imported.json()["ok"] is True and imported.json()["imported"]
    verify = run_ctl("verify", "--store", str(store), home=tmp_path / "h")
    assert verify.rc == 0, verify.stdout + verify.stderr

    # Again into the same tar: incremental, nothing new to copy, still a good bundle.
    before = out.read_bytes()
    again = site.ctl_as_admin(
        "mirror", "export", "--to", str(out), f"{ACT}:1", "--sign-key", "site-1", "--json"
    )
    assert again.rc == 0, again.stderr
    assert again.json()["blobs"] == 0
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == sorted(names)
    assert len(out.read_bytes()) == len(before)  # repacked (new mtimes), same content
    before = out.read_bytes()

    # A failed export leaves the existing tar as it was and nothing else behind.
    failed = site.ctl_as_admin("mirror", "export", "--to", str(out), "kerneld-test/nope:1")
    assert failed.rc != 0 and "prefetch it first" in failed.stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in out_dir.iterdir()) == ["kernels.tar"]


@needs_root
def test_a_directory_export_is_the_admins_too(site: Site) -> None:
    parent = _private_dir(site, "mirrors")
    dest = parent / "m"
    r = site.ctl_as_admin("mirror", "export", "--to", str(dest), f"{ACT}:1")
    assert r.rc == 0, r.stdout + r.stderr
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_uid == site.admin.pw_uid for p in files)
    assert not [p for p in dest.rglob(".tmp-*")]
    # A destination the admin may not write: a clear error, not the daemon's sandbox's.
    denied = site.ctl_as_admin("mirror", "export", "--to", "/root/kernels.tar", f"{ACT}:1")
    assert denied.rc != 0 and "choose a destination you may write" in denied.stderr + denied.stdout


def test_the_receiver_keeps_nothing_of_a_broken_stream(tmp_path: Path) -> None:
    """The writing side alone: a stream cut inside a file, bytes that do not match their sha256
    and paths outside the mirror layout leave no file and no staging directory behind."""
    data = b"kernel bytes\n"
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    rel = blob_path(sha)
    dest = tmp_path / "out.tar"

    with ExportReceiver(dest) as r:
        r.handle("file", "mirror-info", 2, b"{}")
        r.handle("file", rel, len(data), data[:4])
        with pytest.raises(ExportError, match="ended inside"):
            r.commit()
    assert list(tmp_path.iterdir()) == []

    with ExportReceiver(dest) as r, pytest.raises(ExportError, match="do not match"):
        r.handle("file", rel, len(data), b"X" * len(data))
    assert list(tmp_path.iterdir()) == []

    for bad in ("../evil", "/etc/passwd", "blobs/sha256/00/" + sha, "manifests/../../x.json"):
        with ExportReceiver(dest) as r, pytest.raises(ExportError, match="outside the mirror"):
            r.handle("file", bad, 1, b"x")
    assert list(tmp_path.iterdir()) == []

    with ExportReceiver(dest) as r:
        r.handle("file", "mirror-info", 2, b"{}")
        r.handle("file", rel, len(data), data[:4])
        r.handle("data", rel, len(data), data[4:])
        r.commit()
    with tarfile.open(dest) as tar:
        assert sorted(tar.getnames()) == sorted(["mirror-info", rel])
    assert [p.name for p in tmp_path.iterdir()] == ["out.tar"]
