"""Who may open a store, and repair that never destroys what it cannot replace (issue 16 §3.5,
§3.14; issue 20 §1.2).

The admin's scenario, played for real: a store made offline by root (as `kerneldctl mirror
import --store` leaves it, no daemon yet), a daemon started as the unprivileged `kerneld` user on
it (refused, naming the path, the step and the one command that fixes it), that command
(`chown -R`), then
damage on an air-gapped host (no upstream) and `verify --repair`: everything damaged is
quarantined and kept, a status line that follows the store, and a restore that brings back only
intact bytes. Other users are real uids (`as_user`), never mocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.store import Store, StoreOwnershipError, TreeFile
from kerneld.store.layout import check_root
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import TIMEOUT
from tests.security.support import NOBODY, as_user, needs_root, public_dir
from tests.security.test_client_verify import flip_byte
from tests.support.ctl import KERNELDCTL, ctl_env, run_ctl
from tests.support.daemon import DaemonFailed, DaemonProcess
from tests.support.mirrors import variant, write_mirror

pytestmark = needs_root

KERNELD = pwd.getpwnam("kerneld")
COMMITS = {f"kerneld-sec/own{i}": f"{i + 1:040x}" for i in range(4)}
VARIANT = "torch-universal"


@pytest.fixture
def base() -> Iterator[Path]:
    with public_dir("kd-own-") as path:
        yield path


def _owners(root: Path) -> set[int]:
    uids = {root.lstat().st_uid}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            uids.add(os.lstat(os.path.join(dirpath, name)).st_uid)
    return uids


# ------------------------------------------------------------------------- Store.open rules


def test_root_neither_changes_nor_creates_a_store_that_belongs_to_another_user(base: Path) -> None:
    """Root's files in kerneld's store would be unusable by the daemon: refused, with the exact
    command to run instead; read-only inspection still works and trusts the root's owner."""
    os.chown(base, KERNELD.pw_uid, KERNELD.pw_gid)
    root = base / "store"
    # Root may not create it inside kerneld's directory either (nothing is created).
    with pytest.raises(StoreOwnershipError) as info:
        Store.open(root)
    assert "runuser -u kerneld --" in str(info.value) and str(root) in str(info.value)
    assert not root.exists()

    def make() -> int:
        Store.open(root).close()
        return os.stat(root).st_uid

    assert as_user(KERNELD.pw_uid, KERNELD.pw_gid, make) == KERNELD.pw_uid
    with pytest.raises(StoreOwnershipError) as info:
        Store.open(root)
    assert "belongs to kerneld" in str(info.value) and "runuser -u kerneld --" in str(info.value)
    assert _owners(root) == {KERNELD.pw_uid}  # root left nothing behind
    with Store.open(root, read_only=True) as ro:
        assert ro.owner_uid == KERNELD.pw_uid and ro.repair.verify().clean


def test_a_store_owned_by_someone_else_is_refused_with_the_fix(base: Path) -> None:
    """The attack of issue 20 §1.2: a store directory pre-created by another user."""
    planted = base / "planted"
    planted.mkdir()
    os.chown(planted, NOBODY.pw_uid, NOBODY.pw_gid)

    def open_it() -> str:
        try:
            Store.open(planted).close()
        except StoreOwnershipError as exc:
            return str(exc)
        return "opened"

    message = as_user(KERNELD.pw_uid, KERNELD.pw_gid, open_it)
    assert "owned by nobody" in message and "not by kerneld" in message, message
    assert f"chown -R kerneld: {planted}" in message
    assert os.listdir(planted) == []  # nothing written into the foreign directory


def test_a_parent_anyone_may_write_is_refused_unless_sticky(base: Path) -> None:
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(StoreOwnershipError) as info:
        Store.open(shared / "store")
    assert f"chmod o-w {shared}" in str(info.value) and "sticky" in str(info.value)
    assert not (shared / "store").exists()
    shared.chmod(0o1777)  # like /tmp: others cannot rename what is ours
    assert check_root(shared / "store") == os.geteuid()
    Store.open(shared / "store").close()


def test_chown_r_is_the_one_command_that_moves_a_store_to_another_owner(base: Path) -> None:
    """The store remembers no creating uid: its owner is the root directory's owner."""
    root = base / "store"
    with Store.open(root) as store:
        data = b"x"
        sha = store.blobs.ingest(data, size=1, sha256=hashlib.sha256(data).hexdigest()).sha256
    subprocess.run(["chown", "-R", "kerneld:", str(root)], check=True)

    def reopen() -> dict[str, object]:
        with Store.open(root) as store:
            report = store.repair.verify()
            return {
                "owner": store.owner_uid,
                "clean": report.clean,
                "has": store.blobs.has_blob(sha),
            }

    got = as_user(KERNELD.pw_uid, KERNELD.pw_gid, reopen)
    assert got == {"owner": KERNELD.pw_uid, "clean": True, "has": True}


# ------------------------------------------------------------------------- the admin's day


class StatusWatcher:
    """A NOTIFY_SOCKET like systemd's: collects every STATUS= the daemon sends."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        os.chown(self.path, KERNELD.pw_uid, KERNELD.pw_gid)
        self.sock.settimeout(0.2)
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536).decode()
            except TimeoutError:
                continue
            except OSError:
                return
            for field in data.split("\n"):
                if field.startswith("STATUS="):
                    self.lines.append(field.removeprefix("STATUS="))

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in reversed(self.lines):
                if text in line:
                    return line
            time.sleep(0.1)
        raise AssertionError(f"no status line with {text!r}: {self.lines}")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)


def _make_as_root(base: Path) -> Path:
    """A store made by root with no daemon (as `kerneldctl mirror import --store` run by root
    leaves it: every file root's)."""
    root = base / "var-lib-kerneld" / "store"
    with Store.open(root) as store:
        for i, (repo, commit) in enumerate(COMMITS.items()):
            files = []
            for rel, data in variant(f"_own{i}").items():
                sha = hashlib.sha256(data).hexdigest()
                store.blobs.ingest(data, size=len(data), sha256=sha)
                files.append(TreeFile(rel, sha, len(data)))
            store.trees.publish_tree(repo, commit, VARIANT, files)
    assert _owners(root) == {0}
    return root


def _tree_files(root: Path) -> dict[str, bytes]:
    """Every file of every tree, live or quarantined, as "<tree digest>:<path>" -> bytes."""
    trees = {tree.name: tree for tree in root.glob("v1/trees/*")}
    for entry in root.glob("v1/quarantine/*"):
        doc = json.loads((entry / "entry.json").read_text())
        if doc["object"] == "tree":
            trees[doc["id"]] = entry / "tree"
    out: dict[str, bytes] = {}
    for digest, tree in trees.items():
        for path in tree.rglob("*"):
            if path.is_file():
                out[f"{digest}:{path.relative_to(tree)}"] = path.read_bytes()
    return out


@pytest.mark.slow
def test_the_admins_air_gapped_day_loses_nothing(base: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = _make_as_root(base)
    (base / "var-lib-kerneld").chmod(0o755)
    watcher = StatusWatcher(base)
    # Under the public dir, not tmp_path: pytest resets /tmp/pytest-of-root to 0700 whenever
    # another session starts, which would lock `kerneld` out of its own config mid-test.
    # Air-gapped: the only upstream is an (empty) mirror directory, nothing can be re-fetched.
    write_mirror(base / "usb", {})
    daemon = DaemonProcess(
        base / "daemon",
        store=root,
        mirror_dirs=[base / "usb"],
        env={"NOTIFY_SOCKET": str(watcher.path)},
    )
    try:
        # 1. The root-made store: the daemon (kerneld) refuses it, naming path, step and fix.
        with pytest.raises(DaemonFailed) as failed:
            daemon.start()
        text = str(failed.value)
        reason = next((x for x in text.splitlines() if "cannot start" in x), text)
        assert str(root) in reason and "owned by root" in reason, reason
        assert f"chown -R kerneld: {root}" in reason, reason
        assert "Errno" not in reason

        # 2. The one documented command; the store now belongs to kerneld, verify is clean.
        subprocess.run(["chown", "-R", "kerneld:", str(root)], check=True)
        daemon.start()
        watcher.wait_for(f"serving {len(COMMITS)} trees")
        with daemon.admin() as admin:
            events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in events] == [pb.VerifyEvent.SUMMARY], events

        # 3. Damage with no upstream: one tree rots, one blob becomes writable (untrusted).
        before = _tree_files(root)
        trees = sorted(root.glob("v1/trees/*"))
        flip_byte(trees[0] / "__init__.py")
        wanted = hashlib.sha256((trees[1] / "__init__.py").read_bytes()).hexdigest()
        blob = root / "v1" / "blobs" / "sha256" / wanted[:2] / wanted
        blob.chmod(0o664)
        with daemon.admin() as admin:
            events = list(admin.Verify(pb.VerifyRequest(repair=True), timeout=TIMEOUT))
        repaired = [e.detail for e in events if e.problem == pb.VerifyEvent.REPAIRED]
        assert repaired and all("quarantined, not deleted" in r for r in repaired), repaired
        assert any(trees[0].name in r for r in repaired) and any(blob.name in r for r in repaired)

        # 4. Nothing lost: every file of every tree is still on disk, live or quarantined,
        # byte for byte (but the one that rotted), and the blob too.
        after = _tree_files(root)
        assert after.keys() == before.keys()
        changed = {k for k in before if before[k] != after[k]}
        assert changed == {f"{trees[0].name}:__init__.py"}
        assert list(root.glob("v1/quarantine/*/blob")) and not blob.exists()
        entries = sorted((root / "v1" / "quarantine").iterdir())
        docs = [json.loads((e / "entry.json").read_text()) for e in entries]
        assert {d["object"] for d in docs} >= {"tree", "blob"}
        assert all(d["moved"] for d in docs)
        assert _owners(root) == {KERNELD.pw_uid}

        # 5. The status line follows the store (issue 16 §3.14).
        left = len(list(root.glob("v1/trees/*")))
        assert left < len(COMMITS)
        line = watcher.wait_for(f"serving {left} trees")
        assert "quarantined" in line, line
    finally:
        daemon.close()
        watcher.close()

    # 6. Offline tools as root: refused with the exact command, nothing root-owned left.
    refused = run_ctl("verify", "--store", str(root), "--repair", home=home)
    assert refused.rc == 8, refused.stderr
    assert "runuser -u kerneld -- kerneldctl verify --store" in refused.stderr, refused.stderr
    assert _owners(root) == {KERNELD.pw_uid}

    # 7. Restore as the owner: the intact tree comes back verified, the rotten one cannot.
    tree_entry = next(
        e for e, d in zip(entries, docs, strict=True)
        if d["object"] == "tree" and d["id"] == trees[1].name
    )  # fmt: skip
    rotten_entry = next(
        e for e, d in zip(entries, docs, strict=True)
        if d["object"] == "tree" and d["id"] == trees[0].name
    )  # fmt: skip

    def restore(name: str) -> list[str]:
        with Store.open(root) as store:
            return [t.digest for t in store.quarantine.restore(name)]

    assert as_user(KERNELD.pw_uid, KERNELD.pw_gid, lambda: restore(tree_entry.name)) == [
        f"sha256:{trees[1].name}"
    ]
    with pytest.raises(AssertionError, match="DigestMismatch|does not match|hashes to"):
        as_user(KERNELD.pw_uid, KERNELD.pw_gid, lambda: restore(rotten_entry.name))
    assert rotten_entry.exists() and not tree_entry.exists()

    restored = next(d for d in docs if d["object"] == "tree" and d["id"] == trees[1].name)
    assert restored["variants"], restored

    def check() -> dict[str, object]:
        with Store.open(root, read_only=True) as store:
            served = [
                store.index.get_variant(v["repo"], v["commit"], v["variant"])
                for v in restored["variants"]
            ]
            return {
                "clean": store.repair.verify().clean,
                "served": [row.tree if row else None for row in served],
            }

    got = as_user(KERNELD.pw_uid, KERNELD.pw_gid, check)
    assert got == {"clean": True, "served": [trees[1].name] * len(restored["variants"])}
    assert stat.S_IMODE(os.stat(root / "v1" / "quarantine").st_mode) == 0o700

    # 8. The documented command drops what cannot come back, as the owner.
    dropped = subprocess.run(
        ["runuser", "-u", "kerneld", "--", KERNELDCTL, "verify", "--store", str(root), "--drop",
         rotten_entry.name],
        capture_output=True, text=True, env=ctl_env(base / "home"), timeout=60,
    )  # fmt: skip
    assert dropped.returncode == 0, dropped.stderr
    assert f"dropped {rotten_entry.name}" in dropped.stdout
    assert not rotten_entry.exists() and _owners(root) == {KERNELD.pw_uid}
