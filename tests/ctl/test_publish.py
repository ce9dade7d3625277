"""`kerneldctl publish` (issue 18, part 3): a kernel author's local build -> a mirror directory or a
store -> a real daemon -> a real client process that loads it.

Builds are laid out as the kernel builder writes them (`kernel_variant_files`: build/<variant>/...
with a metadata.json digest) in real git checkouts; kerneldctl runs as a subprocess, as an author
runs it; daemons run as their own unprivileged user, as deployed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from kerneld.mirror.documents import Manifest, MirrorWriter, manifest_path, parse_refs, refs_path
from kerneld.mirror.keys import generate_key, parse_public_key, sig_path, verify_signature
from kerneld.store import Store
from tests.client.support import client_env, run_client, tree_snapshot
from tests.support.ctl import KERNELDCTL, Result, ctl_env, run_ctl
from tests.support.daemon import DaemonProcess, account, grant_traversal
from tests.support.gitrepo import GitRepo, kernel_variant_files

REPO = "kerneld-publish/scale"
VARIANT = "torch-universal"

LOAD = """
import json, torch, kerneld_client
try:
    mod = kerneld_client.get_kernel({repo!r}, version=1, policy="error")
    print(json.dumps({{"version": mod.VERSION, "file": mod.__file__}}))
except Exception as exc:
    print(json.dumps({{"error": f"{{type(exc).__name__}}: {{exc}}"}}))
"""


def _build(version: int) -> dict[str, bytes]:
    """What the kernel builder leaves in the repo for one version (build/torch-universal/...)."""
    return kernel_variant_files(
        name="scale", version=version, factor=float(version), data_size=4096
    )


def _kernel_repo(path: Path) -> GitRepo:
    repo = GitRepo(path)
    repo.commit("version 1", {".gitignore": "__pycache__/\n", **_build(1)})
    return repo


def _publish(home: Path, *args: str | Path) -> Result:
    return run_ctl("publish", *map(str, args), home=home)


def _load(d: DaemonProcess, tmp: Path, repo: str = REPO) -> dict[str, object]:
    env = client_env(d.store_root, tmp, KERNELD_SOCKET=str(d.user_socket))
    return run_client(LOAD.format(repo=repo), env)


def _mirror_refs(mirror: Path, repo: str = REPO) -> dict[str, str]:
    return parse_refs((mirror / refs_path(repo)).read_bytes(), repo)[0]


def _store_ref(store: Path, ref: str = "v1") -> str | None:
    with Store.open(store, read_only=True) as s:
        row = s.names.get_ref(REPO, ref)
    return row.commit if row is not None else None


def test_a_published_build_is_served_from_a_mirror(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    repo = _kernel_repo(tmp_path / "scale")
    head = repo.rev_parse("HEAD")
    # A local test import left bytecode in the build: it is never published.
    pyc = repo.path / "build" / VARIANT / "__pycache__" / "_ops.cpython-312.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"\x00bytecode")
    mirror = tmp_path / "mirror"

    res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", mirror, "--json")
    assert res.rc == 0, res.stderr
    doc = res.json()
    assert doc["ok"] is True and doc["commit"] == head and doc["target"] == "mirror"
    assert doc["refs"] == [{"ref": "v1", "commit": head, "previous": None, "action": "set"}]
    [variant] = doc["variants"]
    assert variant["variant"] == VARIANT and variant["skipped"] == ["__pycache__/"]
    manifest = Manifest.from_json(
        (mirror / manifest_path(REPO, head)).read_bytes(), repo_id=REPO, commit=head
    )
    built = sorted(p.removeprefix(f"build/{VARIANT}/") for p in _build(1))
    assert sorted(f.path for f in manifest.variants[VARIANT]) == built
    assert _mirror_refs(mirror) == {"v1": head}

    # Publishing the same build again changes nothing.
    before = tree_snapshot(mirror)
    again = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", mirror, "--json")
    assert again.rc == 0, again.stderr
    assert again.json()["unchanged_variants"] == [VARIANT]
    assert again.json()["refs"][0]["action"] == "unchanged"
    assert tree_snapshot(mirror) == before

    d = make_daemon(mirror_dirs=[mirror])
    loaded = _load(d, tmp_path)
    assert loaded.get("version") == 1, loaded
    # The daemon serves the very tree publish announced.
    assert variant["tree_digest"].removeprefix("sha256:") in str(loaded["file"])


def test_a_signed_publish_is_served_where_signatures_are_required(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    keys = tmp_path / "keys"
    key = generate_key("site-1", keys)
    repo = _kernel_repo(tmp_path / "scale")
    head = repo.rev_parse("HEAD")
    mirror = tmp_path / "mirror"
    signed = ("--sign-key", "site-1", "--key-dir", keys)

    res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", mirror, *signed)
    assert res.rc == 0, res.stderr
    trusted = {"site-1": parse_public_key(key.public)}
    for rel in (manifest_path(REPO, head), refs_path(REPO)):
        data, sig = (mirror / rel).read_bytes(), (mirror / sig_path(rel)).read_bytes()
        assert verify_signature(rel, data, sig, trusted) == "site-1"

    # Another kernel published into the same mirror without a key stays unsigned ...
    unsigned = "kerneld-publish/unsigned"
    other = _kernel_repo(tmp_path / "other")
    res = _publish(home, other.path, "--repo", unsigned, "--ref", "v1", "--mirror", mirror)
    assert res.rc == 0, res.stderr
    # ... but a signed kernel is never silently left unsigned.
    repo.commit("version 2", _build(2))
    res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", mirror)
    assert res.rc == 1 and "--sign-key" in res.stderr, res.stderr
    assert _mirror_refs(mirror) == {"v1": head}

    grant_traversal(mirror / "x")
    d = make_daemon(
        upstreams=[{"kind": "mirror-dir", "path": str(mirror), "require_signatures": True}],
        config={"mirror": {"trusted_keys": {"site-1": key.public}}},
    )
    loaded = _load(d, tmp_path)
    assert loaded.get("version") == 1, loaded
    refused = _load(d, tmp_path, unsigned)
    assert "version" not in refused and "not signed" in str(refused.get("error")), refused


def test_a_file_edited_after_hashing_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = _kernel_repo(tmp_path / "scale")
    mirror = tmp_path / "mirror"
    assert _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", mirror).rc == 0
    before = tree_snapshot(mirror)
    # The author fixes the built package by hand and adds a file, but does not re-run the
    # build's hash step: metadata.json's digest no longer describes the variant.
    ops = f"build/{VARIANT}/_ops.py"
    repo.commit("hand edit", {ops: _build(1)[ops] + b"# fixed\n", f"build/{VARIANT}/extra.py": b""})

    res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", mirror, "--json")
    assert res.rc == 1, res.stderr
    doc = res.json()
    assert doc["ok"] is False and doc["exit_code"] == 1
    assert "content does not match: _ops.py" in doc["error"]
    assert "in the variant but not listed: extra.py" in doc["error"]
    assert "re-run the build's hash step" in doc["error"]
    assert tree_snapshot(mirror) == before

    store = tmp_path / "store"
    res = _publish(home, repo.path, "--repo", REPO, "--store", store)
    assert res.rc == 1 and "re-run the build's hash step" in res.stderr, res.stderr
    assert not store.exists()


def _publish_as(user: str | None, home: Path, *args: str | Path) -> Result:
    """kerneldctl run as `user` (the store's owner), as an admin runs it with `runuser -u`."""
    uid = gid = None
    if user is not None:
        pw = account(user)
        uid, gid = pw.pw_uid, pw.pw_gid
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, uid, gid)
    proc = subprocess.run(
        [KERNELDCTL, "publish", *map(str, args)],
        capture_output=True,
        text=True,
        env=ctl_env(home),
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        user=uid,
        group=gid,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_publish_into_a_stopped_daemons_store(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    # A build outside any git checkout (a CI artifact): one variant folder, its commit given.
    folder = tmp_path / "artifact" / VARIANT
    for rel, data in _build(1).items():
        target = folder / rel.removeprefix(f"build/{VARIANT}/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    commit = "ab" * 20

    res = _publish(home, folder, "--repo", REPO, "--ref", "v1", "--store", tmp_path / "s")
    assert res.rc == 2 and "--commit" in res.stderr, res.stderr
    assert not (tmp_path / "s").exists()

    # A daemon needs an upstream: an empty mirror (the kernel can only come from the store).
    empty = tmp_path / "empty-mirror"
    MirrorWriter(empty).write_info()
    d = make_daemon(mirror_dirs=[empty])
    grant_traversal(folder / "x")  # the store's owner reads the build
    args = (folder, "--repo", REPO, "--commit", commit, "--ref", "v1", "--store", d.store_root)
    busy = _publish_as(d.user, tmp_path / "home-k", *args)
    assert busy.rc == 4, busy.stderr  # the running daemon owns its store
    d.stop()
    res = _publish_as(d.user, tmp_path / "home-k", *args, "--json")
    assert res.rc == 0, res.stderr
    assert res.json()["target"] == "store" and res.json()["commit"] == commit
    d.start()
    loaded = _load(d, tmp_path)
    assert loaded.get("version") == 1, loaded


def test_a_dirty_checkout_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = _kernel_repo(tmp_path / "scale")
    head = repo.rev_parse("HEAD")
    (repo.path / "wip.cu").write_text("// work in progress\n")
    mirror = tmp_path / "mirror"
    res = _publish(home, repo.path, "--repo", REPO, "--mirror", mirror)
    assert res.rc == 1, res.stderr
    assert "uncommitted changes" in res.stderr and "wip.cu" in res.stderr
    assert "--allow-dirty" in res.stderr
    assert not mirror.exists()

    res = _publish(home, repo.path, "--repo", REPO, "--mirror", mirror, "--allow-dirty", "--json")
    assert res.rc == 0, res.stderr
    assert res.json()["dirty"] == ["?? wip.cu"] and res.json()["commit"] == head

    # A destination inside the checkout is not a change of it (a second publish still works).
    (repo.path / "wip.cu").unlink()
    inside = repo.path / "dist" / "mirror"
    for _ in range(2):
        res = _publish(home, repo.path, "--repo", REPO, "--mirror", inside)
        assert res.rc == 0, res.stderr


def test_refs_only_move_forward(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = _kernel_repo(tmp_path / "scale")
    c1 = repo.rev_parse("HEAD")
    mirror, store = tmp_path / "mirror", tmp_path / "store"
    dests = (("--mirror", mirror), ("--store", store))
    for dest in dests:
        assert _publish(home, repo.path, "--repo", REPO, "--ref", "v1", *dest).rc == 0

    c2 = repo.commit("version 2", _build(2))
    for dest in dests:
        res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", *dest, "--json")
        assert res.rc == 0, res.stderr
        assert res.json()["refs"] == [{"ref": "v1", "commit": c2, "previous": c1, "action": "set"}]
    assert _mirror_refs(mirror) == {"v1": c2} and _store_ref(store) == c2

    # The older build, published again with --ref v1, does not move v1 back.
    repo.checkout(c1)
    before = tree_snapshot(mirror)
    for dest in dests:
        res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", *dest)
        assert res.rc == 1, res.stderr
        assert f"v1 points at {c2}, a newer commit (it descends from {c1})" in res.stderr
        assert "would move v1 back" in res.stderr
        assert "--force-refs" in res.stderr
    assert tree_snapshot(mirror) == before
    assert _mirror_refs(mirror) == {"v1": c2} and _store_ref(store) == c2

    # Without the ref it publishes; with --force-refs it is a deliberate rollback.
    assert _publish(home, repo.path, "--repo", REPO, "--ref", "old", "--mirror", mirror).rc == 0
    for dest in dests:
        res = _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--force-refs", *dest)
        assert res.rc == 0, res.stderr
    assert _mirror_refs(mirror) == {"v1": c1, "old": c1} and _store_ref(store) == c1


def test_a_tar_mirror_is_what_mirror_import_takes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = _kernel_repo(tmp_path / "scale")
    head = repo.rev_parse("HEAD")
    tar = tmp_path / "kernels.tar"
    assert _publish(home, repo.path, "--repo", REPO, "--ref", "v1", "--mirror", tar).rc == 0
    store = tmp_path / "store"
    res = run_ctl(
        "mirror",
        "import",
        "--store",
        str(store),
        "--from",
        str(tar),
        "--no-check-sigs",
        "--json",
        home=home,
    )
    assert res.rc == 0, res.stderr
    assert [k["commit"] for k in res.json()["imported"]] == [head]
    assert _store_ref(store) == head


def test_bad_input_is_refused_with_what_to_do(tmp_path: Path) -> None:
    home = tmp_path / "home"
    mirror = tmp_path / "mirror"
    commit = "cd" * 20
    empty = tmp_path / "empty"
    empty.mkdir()
    no_meta = tmp_path / "no-meta"
    (no_meta / "build" / VARIANT).mkdir(parents=True)
    (no_meta / "build" / VARIANT / "__init__.py").write_text("")
    good = tmp_path / "good"
    for rel, data in _build(1).items():
        (good / rel).parent.mkdir(parents=True, exist_ok=True)
        (good / rel).write_bytes(data)
    dest = ("--commit", commit, "--mirror", mirror)
    cases: list[tuple[tuple[str | Path, ...], int, str]] = [
        ((empty, "--repo", REPO, *dest), 1, "has no build/ folder"),
        ((tmp_path / "nope", "--repo", REPO, *dest), 1, "does not exist"),
        ((no_meta, "--repo", REPO, *dest), 1, f"variant {VARIANT} ("),
        ((good, "--repo", "not a repo", *dest), 2, "invalid repo id"),
        ((good, "--repo", "org/../x", *dest), 2, "invalid repo id"),
        ((good, "--repo", REPO, "--commit", "xyz", "--mirror", mirror), 2, "40 hex"),
        ((good, "--repo", REPO, "--commit", commit), 2, "--mirror DIR or --store DIR"),
        ((good, "--repo", REPO, *dest, "--store", tmp_path / "s"), 2, "one place"),
        ((good, "--repo", REPO, *dest, "--ref", "a" * 40), 2, "not a commit"),
        (
            (good, "--repo", REPO, *dest, "--sign-key", "nope", "--key-dir", tmp_path),
            1,
            "no signing key",
        ),
    ]
    for args, code, needle in cases:
        res = _publish(home, *args, "--json")
        assert res.rc == code, (args, res.stderr)
        doc = json.loads(res.stdout)
        assert doc["ok"] is False and doc["exit_code"] == code
        assert needle in res.stderr, (args, res.stderr)
    assert "metadata.json" in _publish(home, no_meta, "--repo", REPO, *dest).stderr
    assert not mirror.exists() and not (tmp_path / "s").exists()
    # The same build, outside git and with a good commit, publishes.
    assert _publish(home, good, "--repo", REPO, *dest).rc == 0
