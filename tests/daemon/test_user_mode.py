"""User mode as an ordinary user, end to end: `kerneld --user`, prefetch, a job's load, GC, verify,
mirror export and a daemon-less import, every process run as the login user `kerneld-tester`
(created by scripts/bootstrap), never as root.

The README promises "no root needed"; the first wave only ever ran this as root, which hid that a
non-root daemon could not publish a tree (a 0555 directory cannot be renamed without
CAP_DAC_OVERRIDE). Needs root only to become that user.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures_daemon import ACT
from tests.security.support import CPU_FACTS, needs_root
from tests.support.daemon import REPO_ROOT, clean_env, grant_traversal

TESTER = "kerneld-tester"
TIMEOUT = 60

LOAD = """
import json, sys
from kerneld_client import get_kernel
k = get_kernel(sys.argv[1], version=1)
print(json.dumps({"name": k.NAME, "file": k.__file__}))
"""


@dataclass
class Login:
    """The ordinary user and the environment its processes get (a fresh home per test)."""

    pw: pwd.struct_passwd
    home: Path
    env: dict[str, str]
    log: Path

    def run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(argv),
            user=self.pw.pw_uid,
            group=self.pw.pw_gid,
            extra_groups=[],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{argv[1:]} as {TESTER} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "kerneld.ctl.main", *args], check=check)


@pytest.fixture
def login(tmp_path: Path) -> Iterator[Login]:
    try:
        pw = pwd.getpwnam(TESTER)
    except KeyError:
        pytest.fail(f"user {TESTER!r} is missing: run scripts/bootstrap as root (it creates it)")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    grant_traversal(home)
    runtime = home / "run"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, pw.pw_uid, pw.pw_gid)
    env = clean_env(
        {
            "HOME": str(home),
            "USER": TESTER,
            "LOGNAME": TESTER,
            "XDG_RUNTIME_DIR": str(runtime),
            "KERNELD_PLATFORM_JSON": CPU_FACTS,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    yield Login(pw, home, env, tmp_path / "kerneld.log")


def _start_daemon(t: Login, mirror: Path) -> subprocess.Popen[bytes]:
    grant_traversal(mirror / "x")
    log = open(t.log, "wb")  # noqa: SIM115 - closed with the process below
    argv = [
        sys.executable,
        "-m",
        "kerneld.server.main",
        "--user",
        "--no-hub",
        "--trust",
        "kerneld-*/*",
    ]
    proc = subprocess.Popen(
        [*argv, "--upstream-mirror-dir", str(mirror)],
        user=t.pw.pw_uid,
        group=t.pw.pw_gid,
        extra_groups=[],
        env=t.env,
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kerneld --user exited {proc.returncode}:\n{(t.log).read_text()}")
        if t.ctl("status", "--json", check=False).returncode == 0:
            return proc
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"not ready:\n{(t.log).read_text()}")


def _owned_by(path: Path, uid: int) -> list[str]:
    """Everything under `path` that `uid` does not own."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames, ""]:
            p = os.path.join(dirpath, name)
            if os.lstat(p).st_uid != uid:
                bad.append(p)
    return bad


@needs_root
def test_user_mode_as_an_ordinary_user_end_to_end(login: Login, kernel_mirror: Path) -> None:
    t = login
    proc = _start_daemon(t, kernel_mirror)
    try:
        # prefetch: the daemon (this user) downloads, verifies and publishes a tree
        t.ctl("prefetch", f"{ACT}:1")
        store = t.home / ".cache" / "kerneld" / "store"
        assert store.is_dir(), sorted(p.name for p in (t.home / ".cache").iterdir())
        # a cache, marked as one: backup tools skip it (bford.info/cachedir)
        tag = (store / "CACHEDIR.TAG").read_text()
        assert tag.startswith("Signature: 8a477f597d28d172789f06886806bc55\n"), tag

        # a job of the same user loads it: the index path (no RPC), from inside the store
        loaded = json.loads(t.run([sys.executable, "-c", LOAD, ACT]).stdout)
        assert loaded["name"].startswith("_act_"), loaded
        assert Path(loaded["file"]).resolve().is_relative_to(store.resolve())

        # and a kernel it never prefetched: the daemon fetches it on demand
        multi = json.loads(t.run([sys.executable, "-c", LOAD, "kerneld-test/multi"]).stdout)
        assert Path(multi["file"]).resolve().is_relative_to(store.resolve())

        # gc and verify through the daemon
        t.ctl("gc")
        verify = json.loads(t.ctl("verify", "--json").stdout)
        assert verify.get("ok", True) is not False, verify

        # export a signed bundle (through the daemon) into the user's own home
        t.ctl("key", "generate", "site")
        public = t.ctl("key", "public", "site").stdout.strip()
        bundle = t.home / "kernels.tar"
        t.ctl("mirror", "export", "--to", str(bundle), "--sign-key", "site", ACT)
        assert bundle.is_file() and bundle.stat().st_uid == t.pw.pw_uid
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, (t.log).read_text()

    # nothing under the home belongs to anyone else, and no tree is writable
    assert _owned_by(t.home, t.pw.pw_uid) == []
    trees = store / "v1" / "trees"
    for tree in trees.iterdir():
        assert tree.stat().st_mode & 0o222 == 0, f"{tree} is writable"

    # a daemon-less import into a second store, then an offline verify of it
    second = t.home / "store2"
    t.ctl(
        "mirror",
        "import",
        "--from",
        str(bundle),
        "--store",
        str(second),
        "--trust",
        f"site={public}",
    )
    t.ctl("verify", "--store", str(second))
    assert any((second / "v1" / "trees").iterdir())
    assert _owned_by(second, t.pw.pw_uid) == []
