"""The real `kerneldctl` on a store directly (`--store`): offline commands, JSON, exit codes."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kerneld.ctl.main import build_parser
from kerneld.store import Store
from tests.support.ctl import KERNELDCTL, ctl_env, publish, run_ctl, sha256, variant_files

K, J = "org/k", "org/j"
CK, CJ = "c" * 40, "d" * 40
SUBCOMMANDS = [
    ["status"],
    ["ls"],
    ["info"],
    ["prefetch"],
    ["pin"],
    ["unpin"],
    ["deny"],
    ["allow"],
    ["gc"],
    ["verify"],
    ["lock"],
    ["mirror"],
    ["mirror", "export"],
    ["mirror", "import"],
    ["key"],
    ["key", "generate"],
    ["key", "public"],
    ["reload"],
    ["env"],
    ["publish"],
]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    with Store.open(root) as store:
        publish(
            store,
            K,
            CK,
            "torch-universal",
            variant_files("_k_1", {"k.py": b"K = 1\n"}),
            refs=("v1",),
        )
        publish(
            store,
            J,
            CJ,
            "torch-cpu",
            variant_files("_j_1", {"j.py": b"J = 1\n"}, deterministic=True),
            refs=("v2",),
        )
    return root


def ctl(tmp_path: Path, *args: str, **kw: object):
    return run_ctl(*args, home=tmp_path / "home", **kw)  # type: ignore[arg-type]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_subcommand_has_help_with_examples_and_exit_codes(tmp_path: Path) -> None:
    parser = build_parser()
    top = _subparsers(parser)
    assert set(top) == {c[0] for c in SUBCOMMANDS if len(c) == 1}
    for cmd in SUBCOMMANDS:
        p = top[cmd[0]] if len(cmd) == 1 else _subparsers(top[cmd[0]])[cmd[1]]
        text = p.format_help()
        assert "examples:" in text and "exit codes:" in text, cmd
        if len(cmd) == 1 and cmd[0] not in ("mirror", "key"):
            assert "--json" in text, cmd
    # and the installed console script prints them
    for cmd in (["--help"], ["mirror", "export", "--help"], ["verify", "--help"]):
        r = ctl(tmp_path, *cmd)
        assert r.rc == 0 and "examples:" in r.stdout and "exit codes:" in r.stdout
    r = ctl(tmp_path)
    assert r.rc == 2 and "usage:" in r.stderr


def test_status_ls_info(tmp_path: Path, store_dir: Path) -> None:
    r = ctl(tmp_path, "status", "--store", str(store_dir), "--json")
    assert r.rc == 0, r.stderr
    doc = r.json()
    assert doc["source"] == "store" and doc["trees"] == 2 and doc["blobs"] == 6
    assert doc["daemon_running"] is False
    assert {(x["repo_id"], x["ref"]) for x in doc["refs"]} == {(K, "v1"), (J, "v2")}

    r = ctl(tmp_path, "ls", "--store", str(store_dir), "--json")
    kernels = {k["repo_id"]: k for k in r.json()["kernels"]}
    assert set(kernels) == {K, J}
    rev = kernels[K]["revisions"][0]
    assert rev["commit"] == CK and rev["refs"] == ["v1"]
    variant = rev["variants"][0]
    assert variant["variant"] == "torch-universal" and variant["files"] == 3
    assert Path(variant["path"], "k.py").read_bytes() == b"K = 1\n"
    r = ctl(tmp_path, "ls", "--store", str(store_dir), J, "--json")
    assert [k["repo_id"] for k in r.json()["kernels"]] == [J]
    human = ctl(tmp_path, "ls", "--store", str(store_dir)).stdout
    assert K in human and "torch-universal" in human and CK[:12] in human

    r = ctl(tmp_path, "info", "--store", str(store_dir), f"{K}:1", "--json")
    assert r.rc == 0, r.stderr
    info = r.json()
    assert info["revisions"][0]["variants"][0]["metadata"]["id"] == "_k_1"
    assert info["revisions"][0]["variants"][0]["metadata"]["deterministic"] is None
    human = ctl(tmp_path, "info", "--store", str(store_dir), K).stdout
    assert "_k_1" in human and "deterministic: undeclared" in human
    r = ctl(tmp_path, "info", "--store", str(store_dir), J, "--json")
    assert r.json()["revisions"][0]["variants"][0]["metadata"]["deterministic"] is True
    assert "deterministic: yes" in ctl(tmp_path, "info", "--store", str(store_dir), J).stdout
    r = ctl(tmp_path, "info", "--store", str(store_dir), f"{K}@v7", "--json")
    assert r.rc == 1 and "not in the store" in r.stderr and "hint: kerneldctl prefetch" in r.stderr
    assert r.json() == {  # --json failures are documents too
        "ok": False,
        "error": f"{K}@v7 is not in the store",
        "hint": f"kerneldctl prefetch {K}@v7",
        "exit_code": 1,
    }


def test_pin_unpin_deny_allow(tmp_path: Path, store_dir: Path) -> None:
    s = ("--store", str(store_dir))
    r = ctl(tmp_path, "pin", *s, f"{K}:1", "--json")
    assert r.rc == 0, r.stderr
    assert r.json() == {"kernel": f"{K}:1", "commit": CK, "trees": 1, "changed": True}
    ls = {k["repo_id"]: k for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    assert ls[K]["revisions"][0]["variants"][0]["pinned"] is True
    assert ls[J]["revisions"][0]["variants"][0]["pinned"] is False
    gc = ctl(tmp_path, "gc", *s, "--dry-run", "--json").json()
    assert gc["dry_run"] is True and gc["removed"] == []
    assert any(x["repo_id"] == K and "pin" in x["reason"] for x in gc["kept"])
    real = ctl(tmp_path, "gc", *s)
    assert real.rc == 0 and "freed 0 B" in real.stdout and "tree(s) kept" in real.stdout
    assert ctl(tmp_path, "unpin", *s, f"{K}:1", "--json").json()["changed"] is True

    r = ctl(tmp_path, "deny", *s, J, "--reason", "crashes", "--json")
    assert r.json() == {
        "repo_id": J,
        "revision": "",
        "kind": "repo",
        "resolved_from": "",
        "changed": True,
    }
    denies = ctl(tmp_path, "deny", *s, "--list", "--json").json()["denies"]
    assert denies == [
        {
            "repo_id": J,
            "revision": "",
            "reason": "crashes",
            "kind": "repo",
            "meaning": "the whole repo: every revision",
            "commits": [],
        }
    ]
    ls = {k["repo_id"]: k for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    assert ls[J]["denied"] is True and ls[K]["denied"] is False
    # the published index tells clients at once
    doc = json.loads((store_dir / "index" / "v1" / "denies.json").read_text())
    assert J in json.dumps(doc)
    r = ctl(tmp_path, "allow", *s, J)
    assert r.rc == 0 and "allowed" in r.stdout
    assert ctl(tmp_path, "allow", *s, J, "--json").json()["changed"] is False  # nothing left


def test_offline_deny_resolves_what_the_store_knows(tmp_path: Path, store_dir: Path) -> None:
    """Without the daemon a deny by ref or commit prefix is resolved from the store, says what
    it resolved, and is refused (usage error, the fix named) when the store cannot say."""
    s = ("--store", str(store_dir))
    r = ctl(tmp_path, "deny", *s, f"{K}:1")
    assert r.rc == 0 and f"denied {K}@{CK} (v1 -> {CK})" in r.stdout, r.stdout + r.stderr
    r = ctl(tmp_path, "deny", *s, f"{K}@{CK[:8]}", "--json")
    assert r.json()["revision"] == CK and r.json()["resolved_from"] == CK[:8]
    assert r.json()["changed"] is False  # the same row as the ref's
    ls = {k["repo_id"]: k for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    assert ls[K]["revisions"][0]["denied"] is True
    assert ls[K]["revisions"][0]["denied_by"] == ["commit"]
    assert ctl(tmp_path, "allow", *s, f"{K}@{CK[:8]}", "--json").json()["changed"] is True
    with Store.open(store_dir) as store:  # a second commit of K sharing 8 hex digits with CK
        other = CK[:8] + "e" * 32
        publish(store, K, other, "torch-universal", variant_files("_k_2", {"k.py": b"K = 2\n"}))
    for bad, words in (
        (f"{K}@{CK[:6]}", "at least 7 hex digits"),
        (f"{K}@{CK[:8]}", f"commit prefix {CK[:8]} is ambiguous: 2 commits"),
        (f"{K}@no-such-ref", "without the daemon"),
        (f"{J}@{CK[:8]}", "no commit of org/j"),
    ):
        r = ctl(tmp_path, "deny", *s, bad)
        assert r.rc == 1 and words in r.stderr, (bad, r.stderr)
    assert ctl(tmp_path, "deny", *s, f"{K}@{CK[:9]}", "--json").json()["revision"] == CK
    assert ctl(tmp_path, "allow", *s, f"{K}@{CK}", "--json").json()["changed"] is True
    # A ref deny is explicit, stored as the name, and does not refuse the commit itself.
    r = ctl(tmp_path, "deny", *s, "--ref", f"{K}@v1", "--json")
    assert (r.json()["kind"], r.json()["revision"]) == ("ref", "v1")
    assert ctl(tmp_path, "deny", *s, "--ref", f"{K}@{CK[:8]}").rc == 1  # reads as a commit
    listed = {
        d["revision"]: d for d in ctl(tmp_path, "deny", *s, "--list", "--json").json()["denies"]
    }
    assert listed["v1"]["commits"] == [CK] and "requests that name it" in listed["v1"]["meaning"]
    ls = {k["repo_id"]: k for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    (rev,) = [r for r in ls[K]["revisions"] if r["commit"] == CK]
    assert rev["denied"] is False and rev["denied_refs"] == ["v1"]
    assert "ref v1 DENIED" in ctl(tmp_path, "ls", *s).stdout
    # A case variant of the repo id names the same repo (the Hub resolves ids so).
    assert ctl(tmp_path, "deny", *s, "ORG/J").rc == 0
    ls = {k["repo_id"]: k for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    assert ls[J]["denied"] is True
    assert ctl(tmp_path, "allow", *s, "org/J", "--json").json()["changed"] is True


def test_verify_exit_bitmask_and_repair(tmp_path: Path, store_dir: Path) -> None:
    s = ("--store", str(store_dir))
    clean = ctl(tmp_path, "verify", *s, "--json")
    assert clean.rc == 0 and clean.json()["problems"] == [] and clean.json()["blobs_checked"] == 6
    blob = next((store_dir / "v1" / "blobs").rglob(sha256(b"J = 1\n")))
    blob.write_bytes(b"J = 2\n")  # root may write a 0444 file: corrupt (1)
    bad = ctl(tmp_path, "verify", *s, "--json")
    assert bad.rc == 1 and bad.json()["exit_mask"] == 1
    assert {p["problem"] for p in bad.json()["problems"]} == {"corrupt"}
    other = next((store_dir / "v1" / "blobs").rglob(sha256(b"K = 1\n")))
    os.chmod(other, 0o666)  # writable by others: untrusted (2)
    bad = ctl(tmp_path, "verify", *s, "--json")
    assert bad.rc == 3 and bad.json()["exit_mask"] == 3
    human = ctl(tmp_path, "verify", *s)
    assert human.rc == 3 and "CORRUPT" in human.stdout
    fixed = ctl(tmp_path, "verify", *s, "--repair", "--json")
    # everything was repaired: exit 0; what was found stays in found_mask
    assert fixed.rc == 0 and fixed.json()["repaired"], fixed.stdout
    assert fixed.json()["found_mask"] == 3 and fixed.json()["remaining"] == []
    after = ctl(tmp_path, "verify", *s, "--json")
    assert after.rc == 0, after.stdout
    kernels = {k["repo_id"] for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    assert J in kernels  # its refs remain; the broken tree is gone
    ls = {k["repo_id"]: k for k in ctl(tmp_path, "ls", *s, "--json").json()["kernels"]}
    assert all(not r["variants"] for r in ls[J]["revisions"])
    assert ctl(tmp_path, "verify", "--store", str(tmp_path / "nope")).rc == 8


def test_env(tmp_path: Path, store_dir: Path) -> None:
    s = ("--store", str(store_dir))
    r = ctl(tmp_path, "env", *s, "--variant", "torch-cpu", J)
    assert r.rc == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("LOCAL_KERNELS=")
    entries = dict(e.split("=", 1) for e in line.removeprefix("LOCAL_KERNELS=").split(":"))
    assert Path(entries[J], "j.py").read_bytes() == b"J = 1\n"
    auto = ctl(tmp_path, "env", *s, "--json")  # picks this host's best variant (imports torch)
    assert auto.rc == 0, auto.stderr
    doc = auto.json()
    assert {e["repo_id"] for e in doc["kernels"]} == {K, J}
    assert doc["LOCAL_KERNELS"].count("=") == 2
    missing = ctl(tmp_path, "env", *s, "org/none")
    assert missing.rc == 1 and "skipped org/none" in missing.stderr
    # names as the Hub means them: another letter case, a commit's unique prefix
    named = ctl(tmp_path, "env", *s, f"{J.upper()}@{CJ[:10]}", "--json")
    assert named.rc == 0, named.stderr
    assert [(e["repo_id"], e["commit"]) for e in named.json()["kernels"]] == [(J, CJ)]
    unknown = ctl(tmp_path, "env", *s, f"{J}@v9")
    assert unknown.rc == 1 and f"skipped {J}: v9 is not in the store" in unknown.stderr


def test_env_says_when_its_interpreter_has_no_torch(tmp_path: Path, store_dir: Path) -> None:
    """`env` chooses each variant for the interpreter kerneldctl runs in. A system install's
    (/opt/kerneld) has no torch, so there a build for torch cannot fit, though the job that
    reads LOCAL_KERNELS has torch: the skip says so, and what to do, instead of "nothing fits"."""
    t, compiled = "org/t", "torch213-cxx11-cpu-x86_64-linux"  # this suite's torch, 2.13
    with Store.open(store_dir) as store:
        files = variant_files("_t_1", {"t.py": b"T = 1\n"})
        publish(store, t, "e" * 40, compiled, files, refs=("v1",))
    s = ("--store", str(store_dir))
    no_torch = {"KERNELD_PLATFORM_JSON": "{}"}  # the facts of an interpreter without torch
    r = ctl(tmp_path, "env", *s, t, "--json", env=no_torch)
    assert r.rc == 1 and r.json()["kernels"] == [], r.stdout
    skip, note = r.stderr.splitlines()
    assert skip.startswith(f"kerneldctl env: skipped {t}@") and "has no torch" in skip, skip
    assert "--python with the job's interpreter" in skip and "--variant NAME" in skip, skip
    assert note.startswith("kerneldctl env: builds for torch were left out"), note
    # with torch (this interpreter) the build fits; without, --variant names it
    assert ctl(tmp_path, "env", *s, t, "--json").json()["kernels"][0]["variant"] == compiled
    forced = ctl(tmp_path, "env", *s, t, "--variant", compiled, "--json", env=no_torch)
    assert forced.rc == 0 and "has no torch" not in forced.stderr, forced.stderr
    # a noarch build needs no torch: nothing was left out, nothing to say
    plain = ctl(tmp_path, "env", *s, K, "--json", env=no_torch)
    assert plain.rc == 0 and plain.stderr == "", plain.stderr


def test_env_chooses_for_the_jobs_interpreter_with_python(tmp_path: Path, store_dir: Path) -> None:
    """`env --python PATH` detects the platform in the job's interpreter, not kerneldctl's: a
    system install's kerneldctl has no torch (here: KERNELD_PLATFORM_JSON='{}', which must not
    reach the job's detection), the job's venv has; a venv without torch gets what fits it."""
    t, compiled = "org/t", "torch213-cxx11-cpu-x86_64-linux"  # this suite's torch, 2.13
    with Store.open(store_dir) as store:
        files = variant_files("_t_1", {"t.py": b"T = 1\n"})
        publish(store, t, "e" * 40, compiled, files, refs=("v1",))
    s = ("--store", str(store_dir))
    no_torch = {"KERNELD_PLATFORM_JSON": "{}"}
    job = sys.executable  # this suite's venv, with torch
    r = ctl(tmp_path, "env", *s, t, "--python", job, "--json", env=no_torch)
    assert r.rc == 0 and r.stderr == "", r.stderr
    doc = r.json()
    assert [k["variant"] for k in doc["kernels"]] == [compiled] and doc["chosen_for"] == job, doc
    # a job interpreter without torch: a bare venv of the same Python
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    bare_python = str(bare / "bin" / "python")
    r = ctl(tmp_path, "env", *s, t, K, "--python", bare_python, "--json")
    assert r.rc == 1, r.stdout
    assert [k["repo_id"] for k in r.json()["kernels"]] == [K], r.stdout  # K's build is noarch
    skip = r.stderr.splitlines()[0]
    assert f"fits the platform of {bare_python}" in skip, skip
    assert f"{bare_python} has no torch" in skip, skip
    # what cannot tell its platform is named, with the reason
    for python, says in (
        (str(tmp_path / "nope" / "python"), "cannot run --python"),
        ("/bin/false", "could not detect its platform (exit 1)"),
    ):
        r = ctl(tmp_path, "env", *s, t, "--python", python)
        assert r.rc == 1 and says in r.stderr and python in r.stderr, r.stderr
    r = ctl(tmp_path, "env", *s, t, "--python", job, "--variant", compiled)
    assert r.rc == 2 and "not allowed with" in r.stderr, r.stderr


def test_usage_errors_exit_2(tmp_path: Path, store_dir: Path) -> None:
    for args in (
        ["info", "not a spec"],
        ["prefetch", "--store", str(store_dir)],
        ["prefetch", "org/k", "--torch", "two"],
        ["verify", "--bogus"],
        ["mirror", "export", "--to", str(tmp_path / "m")],
    ):
        r = ctl(tmp_path, *args)
        assert r.rc == 2, (args, r.stdout, r.stderr)


def test_daemon_unavailable_is_exit_3(tmp_path: Path) -> None:
    missing = tmp_path / "run" / "admin.sock"
    r = ctl(tmp_path, "status", env={"KERNELD_ADMIN_SOCKET": str(missing)})
    assert r.rc == 3 and "not running" in r.stderr and "--store" in r.stderr
    # a stale socket: bound once, nobody listening
    stale = tmp_path / "stale.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(stale))
    sock.close()
    for cmd in (["gc", "--json"], ["mirror", "import", "--from", str(tmp_path)]):
        r = ctl(tmp_path, *cmd, "--admin-socket", str(stale))
        assert r.rc == 3 and "stale admin socket" in r.stderr, (cmd, r.stderr)
        if "--json" in cmd:
            assert r.json()["exit_code"] == 3 and r.json()["ok"] is False
    assert r.stdout == ""  # without --json, stdout stays clean
    r = ctl(tmp_path, "verify", "--admin-socket", str(stale))
    assert r.rc == 8  # verify keeps 1/2/4 for findings


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to take away the permission override",
)
def test_admin_socket_permission_is_explained(tmp_path: Path) -> None:
    """A socket of another owner, mode 0600, reached without CAP_DAC_OVERRIDE: EACCES."""
    path = tmp_path / "admin.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    os.chmod(path, 0o600)
    os.chown(path, 65534, 65534)
    caps = "-dac_override,-dac_read_search"
    try:
        proc = subprocess.run(
            ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", KERNELDCTL, "status"],
            capture_output=True,
            text=True,
            env=ctl_env(tmp_path / "home", {"KERNELD_ADMIN_SOCKET": str(path)}),
            timeout=60,
        )
    finally:
        server.close()
    assert proc.returncode == 5, proc.stderr  # its own code: not "daemon unavailable" (3)
    assert "permission denied on the admin socket" in proc.stderr
    assert "kerneld-admin" in proc.stderr


def test_store_owned_by_a_running_daemon_is_exit_4(tmp_path: Path, store_dir: Path) -> None:
    with Store.open(store_dir):  # holds the owner lock, as a daemon does
        r = ctl(tmp_path, "pin", "--store", str(store_dir), K)
        assert r.rc == 4 and "owned by a running daemon" in r.stderr
        # read-only commands still work next to it
        status = ctl(tmp_path, "status", "--store", str(store_dir), "--json")
        assert status.rc == 0 and status.json()["daemon_running"] is True
        if os.geteuid() == 0:
            # A daemon's store belongs to its user: root is told to go through the daemon, not
            # to rerun as the store's owner (which would only meet the same running daemon).
            subprocess.run(["chown", "-R", "nobody", str(store_dir)], check=True)
            r = ctl(tmp_path, "pin", "--store", str(store_dir), K)
            assert r.rc == 4 and "drop --store" in r.stderr and "runuser" not in r.stderr, r


def test_keys(tmp_path: Path) -> None:
    kd = str(tmp_path / "keys")
    r = ctl(tmp_path, "key", "generate", "site-1", "--key-dir", kd, "--json")
    assert r.rc == 0, r.stderr
    doc = r.json()
    assert doc["public_key"].startswith("ed25519:")
    assert stat.S_IMODE(Path(doc["private_key_file"]).stat().st_mode) == 0o600
    again = ctl(tmp_path, "key", "generate", "site-1", "--key-dir", kd)
    assert again.rc == 1 and "already exists" in again.stderr
    pub = ctl(tmp_path, "key", "public", "site-1", "--key-dir", kd)
    assert pub.stdout.strip() == doc["public_key"]
    # the default key directory follows $KERNELD_KEY_DIR
    r = ctl(tmp_path, "key", "generate", "site-2", env={"KERNELD_KEY_DIR": kd})
    assert r.rc == 0 and (tmp_path / "keys" / "site-2.pub").exists()


def test_mirror_export_import_via_cli(tmp_path: Path, store_dir: Path) -> None:
    kd = str(tmp_path / "keys")
    pub = ctl(tmp_path, "key", "generate", "site-1", "--key-dir", kd, "--json").json()
    tar = tmp_path / "out" / "bundle.tar"
    r = ctl(
        tmp_path,
        "mirror",
        "export",
        "--store",
        str(store_dir),
        "--to",
        str(tar),
        f"{K}:1",
        J,
        "--sign-key",
        "site-1",
        "--key-dir",
        kd,
        "--json",
    )
    assert r.rc == 0, r.stderr
    assert {k["repo_id"] for k in r.json()["kernels"]} == {K, J}
    assert r.json()["signed_by"] == ["site-1"]
    quiet = ctl(tmp_path, "mirror", "export", "--store", str(store_dir), "--to", str(tar), J)
    assert quiet.rc == 0 and "\r" not in quiet.stdout and "exported" in quiet.stdout

    dest = tmp_path / "other-store"
    refused = ctl(tmp_path, "mirror", "import", "--store", str(dest), "--from", str(tar))
    assert refused.rc == 1 and "no trusted mirror keys" in refused.stderr
    ok = ctl(
        tmp_path,
        "mirror",
        "import",
        "--store",
        str(dest),
        "--from",
        str(tar),
        "--trust",
        f"site-1={pub['public_key']}",
        "--json",
    )
    assert ok.rc == 0, ok.stderr
    assert ok.json()["ok"] is True and ok.json()["signed_by"] == ["site-1"]
    # trusted keys also come from the config file, as the daemon reads them
    config = tmp_path / "kerneld.toml"
    config.write_text(f'[mirror.trusted_keys]\nsite-1 = "{pub["public_key"]}"\n')
    again = ctl(
        tmp_path,
        "mirror",
        "import",
        "--store",
        str(dest),
        "--from",
        str(tar),
        "--config",
        str(config),
        "--json",
    )
    assert again.rc == 0 and again.json()["blobs_ingested"] == 0
    ls = {
        k["repo_id"] for k in ctl(tmp_path, "ls", "--store", str(dest), "--json").json()["kernels"]
    }
    assert ls == {K, J}


def test_an_offline_change_keeps_the_daemons_picks(tmp_path: Path, store_dir: Path) -> None:
    """A tool that opens the store while the daemon is stopped republishes the index: with the
    picks of the platforms the daemon saved, not without them (every warm load would then rank
    for itself until the daemon rewrote every document again)."""
    from kerneld.pipeline.prefetch import ClientPlatforms, platforms_file
    from kerneld_client.variants import PlatformFacts, fingerprint

    facts = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)
    ClientPlatforms(platforms_file(store_dir)).record(facts)  # as the daemon saves them
    r = ctl(tmp_path, "deny", "--store", str(store_dir), K, "--reason", "r", "--json")
    assert r.rc == 0, r.stderr
    doc = json.loads((store_dir / "index" / "v1" / "org" / "j.json").read_text())
    assert doc["commits"][CJ]["picks"] == {fingerprint(facts.to_dict()): "torch-cpu"}


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_store_mounted_read_only_elsewhere_is_read(tmp_path: Path, store_dir: Path) -> None:
    """The store as a container sees it (docs/containers.md): bind-mounted read-only at another
    path, its daemon stopped. `--store` reads it there: SQLite cannot create the index's
    ``-shm`` on that file system, so the index is opened immutable (before: "unable to open
    database file")."""
    view = tmp_path / "container-view"
    view.mkdir()
    subprocess.run(["mount", "--bind", str(store_dir), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        r = ctl(tmp_path, "ls", "--store", str(view), "--json")
        assert r.rc == 0, r.stderr
        kernels = {k["repo_id"]: k for k in r.json()["kernels"]}
        variant = kernels[K]["revisions"][0]["variants"][0]
        assert Path(variant["path"]).is_relative_to(view)  # paths where this reader sees them
        assert Path(variant["path"], "k.py").read_bytes() == b"K = 1\n"
        r = ctl(tmp_path, "status", "--store", str(view), "--json")
        assert r.rc == 0 and r.json()["trees"] == 2, r.stderr
        r = ctl(tmp_path, "verify", "--store", str(view), "--json")
        assert r.rc == 0, r.stderr
        r = ctl(tmp_path, "pin", "--store", str(view), K)  # writing needs the owner's store
        assert r.rc != 0
    finally:
        subprocess.run(["umount", str(view)], check=False)
    assert not list(store_dir.rglob("*-shm"))  # nothing was written into the store
