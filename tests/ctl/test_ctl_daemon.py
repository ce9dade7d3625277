"""kerneldctl against the real daemon (subprocess, temp sockets): every admin command over the
admin socket, JSON output, progress on a terminal, and mirror export/import between two daemons."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.mirror.keys import generate_key
from kerneld_client.lockfile import parse_lockfile
from tests.fixtures_daemon import ACT, C1, DEP_BOTTOM, DEP_TOP, MULTI
from tests.support.ctl import Result, run_ctl, run_ctl_tty
from tests.support.daemon import DaemonProcess, grant_traversal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Daemons:
    def __init__(self, base: Path, mirror: Path) -> None:
        self.keys = base / "keys"
        self.key = generate_key("site-1", self.keys)
        # kerneldctl signs, with the admin's keys: the daemon gets no key directory at all
        self.a = DaemonProcess(base / "a", mirror_dirs=[mirror])
        # the air-gapped one: its only upstream, the Hub, is unreachable
        self.b = DaemonProcess(
            base / "b",
            hub_endpoint="http://127.0.0.1:9",
            config={"mirror": {"trusted_keys": {"site-1": self.key.public}}},
        )
        self.home = base / "home"

    def ctl(self, *args: str, daemon: DaemonProcess | None = None) -> Result:
        d = daemon or self.a
        env = {
            "KERNELD_ADMIN_SOCKET": str(d.admin_socket),
            "KERNELD_SOCKET": str(d.user_socket),
            "KERNELD_KEY_DIR": str(self.keys),
        }
        return run_ctl(*args, home=self.home, env=env)


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory, kernel_mirror: Path) -> Iterator[Daemons]:
    ds = Daemons(tmp_path_factory.mktemp("ctl-daemons"), kernel_mirror)
    try:
        ds.a.start()
        ds.b.start()
        yield ds
    finally:
        ds.a.close()
        ds.b.close()


def test_status(daemons: Daemons) -> None:
    r = daemons.ctl("status", "--json")
    assert r.rc == 0, r.stderr
    doc = r.json()
    assert doc["source"] == "daemon" and doc["ready"] is True
    assert doc["store_root"] == str(daemons.a.store_root)
    assert [u["kind"] for u in doc["upstreams"]] == ["mirror-dir"]
    human = daemons.ctl("status")
    assert human.rc == 0 and "ready" in human.stdout and "mirror-dir" in human.stdout


def test_prefetch_quiet_json_and_failures(daemons: Daemons) -> None:
    r = daemons.ctl("prefetch", f"{ACT}:1", "kerneld-test/nope:1", "--variants", "all")
    assert r.rc == 1
    assert "\r" not in r.stdout and not ANSI.search(r.stdout)
    assert f"ok {ACT}@1111111" in r.stdout and "FAILED kerneld-test/nope" in r.stdout
    assert "1 kernel(s) ok, 1 failed" in r.stdout

    r = daemons.ctl("prefetch", f"{DEP_TOP}:1", "--json")
    assert r.rc == 0, r.stdout + r.stderr
    doc = r.json()
    assert doc["ok"] and {k["repo_id"] for k in doc["kernels"]} == {DEP_TOP, DEP_BOTTOM}
    assert all(k["commit"] == C1 and k["variants"] for k in doc["kernels"])


def test_prefetch_progress_on_a_terminal(daemons: Daemons) -> None:
    env = {"KERNELD_ADMIN_SOCKET": str(daemons.a.admin_socket)}
    r = run_ctl_tty(
        "prefetch",
        f"{MULTI}:1",
        "--variants",
        "torch-cpu",
        "torch-universal",
        "torch213-cxx11-cpu-x86_64-linux",
        home=daemons.home,
        env=env,
    )
    assert r.rc == 0, r.stdout
    text = ANSI.sub("", r.stdout)
    assert "━" in text and re.search(r"\d+/\d+ files", text) and "bytes" in text
    assert f"ok {MULTI}@1111111" in text


def test_ls_info_pin_deny_gc_verify(daemons: Daemons) -> None:
    assert daemons.ctl("prefetch", f"{ACT}:1", "--variants", "all").rc == 0
    ls = daemons.ctl("ls", ACT, "--json")
    assert ls.rc == 0, ls.stderr
    (kernel,) = ls.json()["kernels"]
    rev = next(r for r in kernel["revisions"] if r["commit"] == C1)
    assert "v1" in rev["refs"]
    assert {v["variant"] for v in rev["variants"]} == {
        "torch-universal",
        "torch213-cxx11-cpu-x86_64-linux",
    }
    info = daemons.ctl("info", f"{ACT}@v1", "--json").json()
    ids = {v["metadata"]["id"] for r in info["revisions"] for v in r["variants"]}
    assert ids == {"_act_universal", "_act_cpu213"}

    pin = daemons.ctl("pin", f"{ACT}:1", "--json")
    assert pin.rc == 0 and pin.json()["commit"] == C1 and pin.json()["trees"] == 2
    ls = daemons.ctl("ls", ACT, "--json").json()["kernels"][0]
    assert all(v["pinned"] for r in ls["revisions"] for v in r["variants"])
    gc = daemons.ctl("gc", "--dry-run", "--json")
    assert gc.rc == 0 and gc.json()["dry_run"] is True
    assert all(item["repo_id"] != ACT for item in gc.json()["removed"])
    assert daemons.ctl("unpin", f"{ACT}:1").rc == 0

    assert daemons.ctl("deny", MULTI, "--reason", "bad build").rc == 0
    denies = daemons.ctl("deny", "--list", "--json").json()["denies"]
    assert [(d["repo_id"], d["revision"], d["reason"]) for d in denies] == [
        (MULTI, "", "bad build")
    ]
    refused = daemons.ctl("prefetch", f"{MULTI}:1")
    assert refused.rc == 1 and "FAILED" in refused.stdout
    assert daemons.ctl("allow", MULTI, "--json").json()["changed"] is True

    verify = daemons.ctl("verify", "--json")
    assert verify.rc == 0, verify.stdout + verify.stderr
    assert verify.json()["exit_mask"] == 0 and verify.json()["trees_checked"] >= 2


def test_env_uses_the_daemons_store(daemons: Daemons) -> None:
    assert daemons.ctl("prefetch", f"{ACT}:1", "--variants", "all").rc == 0
    r = daemons.ctl("env", ACT, "--variant", "torch-universal")
    assert r.rc == 0, r.stderr
    path = r.stdout.strip().removeprefix(f"LOCAL_KERNELS={ACT}=")
    assert Path(path).is_relative_to(daemons.a.store_root)
    assert (Path(path) / "metadata.json").is_file()


def test_lock_against_the_daemon(daemons: Daemons, tmp_path: Path) -> None:
    assert daemons.ctl("prefetch", f"{DEP_TOP}:1").rc == 0
    (tmp_path / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{DEP_TOP}" = 1\n')
    r = daemons.ctl("lock", str(tmp_path), "--source", "daemon", "--json")
    assert r.rc == 0, r.stderr
    locks = parse_lockfile((tmp_path / "kernels.lock").read_bytes()).locks
    assert {(x.dependency.repo_id, x.dependency.ref, x.commit) for x in locks} == {
        (DEP_TOP, "v1", C1),
        (DEP_BOTTOM, "v1", C1),
    }


def test_mirror_export_and_import_between_daemons(daemons: Daemons, tmp_path: Path) -> None:
    assert daemons.ctl("prefetch", f"{ACT}:1", "--variants", "all").rc == 0
    out = tmp_path / "bundle.tar"
    exported = daemons.ctl(
        "mirror", "export", "--to", str(out), f"{ACT}:1", "--sign-key", "site-1", "--json"
    )
    assert exported.rc == 0, exported.stderr
    assert exported.json()["kernels"] == [{"repo_id": ACT, "commit": C1}]
    assert out.is_file()

    # The bundle stays where the admin put it (pytest's 0700 directories: the daemon, as its
    # own user, could not open it): kerneldctl reads it and uploads it.
    imported = daemons.ctl("mirror", "import", "--from", str(out), "--json", daemon=daemons.b)
    assert imported.rc == 0, imported.stdout + imported.stderr
    assert imported.json()["ok"] is True
    ls = daemons.ctl("ls", "--json", daemon=daemons.b).json()["kernels"]
    assert [k["repo_id"] for k in ls] == [ACT]
    assert "v1" in ls[0]["revisions"][0]["refs"]

    # The caller's own keys sign (--key-dir too), never the daemon: it could not read them.
    second = generate_key("site-2", tmp_path / "keys")
    other = daemons.ctl(
        "mirror",
        "export",
        "--to",
        str(tmp_path / "x"),
        f"{ACT}:1",
        "--sign-key",
        "site-2",
        "--key-dir",
        str(tmp_path / "keys"),
        "--json",
    )
    assert other.rc == 0 and other.json()["signed_by"] == ["site-2"], other.stderr
    sigs = json.loads((tmp_path / "x" / "refs" / f"{ACT}.json.sig").read_text())
    assert sorted(sigs["signatures"]) == ["site-2"] and second.public

    unsigned = tmp_path / "unsigned"
    assert daemons.ctl("mirror", "export", "--to", str(unsigned), f"{ACT}:1").rc == 0
    grant_traversal(unsigned / "mirror-info")
    refused = daemons.ctl("mirror", "import", "--from", str(unsigned), daemon=daemons.b)
    assert refused.rc == 1 and "not signed" in refused.stdout + refused.stderr


def test_mirror_import_uploads_a_directory_from_a_private_place_and_logs_failures(
    daemons: Daemons, tmp_path: Path
) -> None:
    """operations.md "Mirrors", step 2 from an admin's home (a directory only its owner may
    read): the daemon never opens the path, kerneldctl sends the bundle; a bad one is refused
    with one warning line in the daemon's log."""
    assert daemons.ctl("prefetch", f"{MULTI}:1", "--variants", "all").rc == 0
    home = tmp_path / "admin-home"
    home.mkdir(mode=0o700)
    mirror = home / "mirror"
    exported = daemons.ctl(
        "mirror", "export", "--to", str(mirror), f"{MULTI}:1", "--sign-key", "site-1"
    )
    assert exported.rc == 0, exported.stderr
    imported = daemons.ctl("mirror", "import", "--from", str(mirror), "--json", daemon=daemons.b)
    assert imported.rc == 0, imported.stdout + imported.stderr
    assert imported.json()["imported"] == [{"repo_id": MULTI, "commit": C1}]
    assert any(
        k["repo_id"] == MULTI
        for k in daemons.ctl("ls", "--json", daemon=daemons.b).json()["kernels"]
    )

    missing = daemons.ctl("mirror", "import", "--from", str(home / "nope.tar"), daemon=daemons.b)
    assert missing.rc == 1 and "does not exist" in missing.stderr, missing
    junk = home / "junk.tar"
    junk.write_bytes(b"not a tar" * 100)
    refused = daemons.ctl("mirror", "import", "--from", str(junk), daemon=daemons.b)
    assert refused.rc != 0, refused
    lines = [x for x in daemons.b.logs().splitlines() if "mirror import" in x and "junk" in x]
    assert any(" WARNING " in x for x in lines), lines
