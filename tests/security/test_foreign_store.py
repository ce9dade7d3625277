"""A store or an advert that another user could have made is never used (issue 20 §1.2).

The client used to trust whoever owned the store root, and read the daemon's advert whoever had
written it. With a store or socket path in a world-writable directory, `nobody` pre-created the
store (or planted an advert beside the socket naming a store of theirs) and the victim imported
their code. Now the client trusts a root only if it belongs to root, to the process's own user
or to the daemon's user (`kerneld`, or KERNELD_STORE_OWNER), and only if no directory above it
lets anyone else replace it (sticky directories are fine for entries a trusted user owns); the
same for the advert and the socket's directory. Refusals are UntrustedPath, so the job falls back.

The attacker is `nobody` (forked, pure `os` calls); the victims are fresh client processes (as
root, like a training job) and forked processes of other users for the acceptance rules.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneld.server.plumbing.sockets import write_advert
from kerneld_client import UntrustedPath, _path_trust
from kerneld_client.locations import Advert, advert_path, read_advert
from tests.client.support import client_env, publish_synthetic, run_client, synthetic_metadata
from tests.security.support import (
    CPU_FACTS,
    NOBODY,
    VICTIM,
    as_nobody,
    needs_root,
    public_dir,
)

pytestmark = [
    needs_root,
    pytest.mark.filterwarnings("ignore::kerneld_client.KernelFallbackWarning"),
]

REPO = "kerneld-sec/planted"
COMMIT = "f" * 40
VARIANT = "torch-universal"


def _daemon_uid() -> int | None:
    try:
        return pwd.getpwnam("kerneld").pw_uid
    except KeyError:
        return None


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory, like /tmp (owned by root)."""
    with public_dir("kd-sec-shared-") as base:
        base.chmod(0o1777)
        yield base


@pytest.fixture
def attacker_store(shared: Path) -> Iterator[tuple[Path, Path]]:
    """(nobody's store in the shared directory, the marker its kernel writes when imported).

    A well-formed store: made by the real store code as a template, then copied by `nobody`
    (index, trees, locks: everything a client reads), so every file in it is theirs and as
    consistent as one the daemon publishes."""
    marker = shared / "pwned"
    with public_dir("kd-sec-tpl-") as tpl:
        files = {"__init__.py": f"open({str(marker)!r}, 'w').write('x')\nKID = 'evil'\n".encode()}
        files["metadata.json"] = synthetic_metadata(
            files, kid="_sec_planted", name="planted", backend={"type": "cpu"}
        )
        publish_synthetic(tpl / "store", REPO, COMMIT, {VARIANT: files}, refs={"v1": COMMIT})
        target = shared / "store"

        def copy() -> None:
            (target / "v1").mkdir(mode=0o755, parents=True)
            for part in ("index", "locks", "v1/trees"):
                shutil.copytree(tpl / "store" / part, target / part, symlinks=True)

        as_nobody(copy)
    assert target.stat().st_uid == NOBODY.pw_uid
    yield target, marker


def _victim(tmp_path: Path, store: Path | None, **extra: str) -> dict[str, Any]:
    env = client_env(store, tmp_path, KERNELD_PLATFORM_JSON=CPU_FACTS, **extra)
    return run_client(VICTIM % {"repo": REPO}, env)


def _refused(out: dict[str, Any], marker: Path, *needles: str) -> None:
    assert "kid" not in out, f"the victim imported the attacker's kernel: {out}"
    assert out["error"] == "UntrustedPath", out
    for needle in needles:
        assert needle in out["message"], out["message"]
    assert out["default"] == "torch"  # the job falls back
    assert not marker.exists()


# ------------------------------------------------------------------------------- attacks


def test_a_store_pre_created_by_another_user_is_refused(
    attacker_store: tuple[Path, Path], tmp_path: Path
) -> None:
    """KERNELD_STORE in a world-writable directory, created by nobody before the daemon: the
    victim refuses it (naming the owner and the setting that would make it trusted)."""
    store, marker = attacker_store
    out = _victim(tmp_path, store)
    _refused(out, marker, f"owned by uid {NOBODY.pw_uid}", "KERNELD_STORE_OWNER")


def test_a_planted_advert_beside_the_socket_is_refused(
    attacker_store: tuple[Path, Path], shared: Path, tmp_path: Path
) -> None:
    """KERNELD_SOCKET in a world-writable directory and no daemon running: nobody writes the
    advert beside it, naming their store. The victim refuses the advert itself."""
    store, marker = attacker_store
    sock = shared / "kerneld.sock"
    doc = Advert(store, store / "index" / "v1", sock, shared / "admin.sock", 1, "0").to_json()

    def plant() -> None:
        advert_path(sock).write_text(doc)
        advert_path(sock).chmod(0o644)

    as_nobody(plant)
    out = _victim(tmp_path, None, KERNELD_SOCKET=str(sock))
    _refused(out, marker, "advert", f"owned by uid {NOBODY.pw_uid}")


def test_a_root_owned_store_under_a_foreign_or_open_directory_is_refused(
    shared: Path, tmp_path: Path
) -> None:
    """The root's own owner is not enough: a directory above it that nobody owns, or that is
    world-writable without the sticky bit, lets them swap the store for their own."""
    opened = shared / "open"
    opened.mkdir()
    opened.chmod(0o777)
    store = opened / "store"
    store.mkdir(mode=0o755)
    with pytest.raises(UntrustedPath, match="not sticky"):
        _path_trust.store_root(store)

    theirs = shared / "theirs"
    as_nobody(lambda: theirs.mkdir(mode=0o755))
    store = theirs / "store"
    store.mkdir(mode=0o755)  # root may create it there; nobody could still rename it away
    with pytest.raises(UntrustedPath, match=f"owned by uid {NOBODY.pw_uid}"):
        _path_trust.store_root(store)


def test_an_untrusted_advert_is_refused_however_it_is_untrusted(shared: Path) -> None:
    """A root-owned advert that is writable by others, one in a world-writable directory
    without the sticky bit, and a symlink: each refused."""
    advert = Advert(shared, shared, shared / "k.sock", shared / "a.sock", 1, "0").to_json()
    writable = shared / "k.sock"
    advert_path(writable).write_text(advert)
    advert_path(writable).chmod(0o666)
    with pytest.raises(UntrustedPath, match="writable by group or others"):
        read_advert(writable)

    opened = shared / "open"
    opened.mkdir()
    opened.chmod(0o777)
    advert_path(opened / "k.sock").write_text(advert)
    advert_path(opened / "k.sock").chmod(0o644)
    with pytest.raises(UntrustedPath, match="not sticky"):
        read_advert(opened / "k.sock")

    linked = shared / "l.sock"
    advert_path(linked).symlink_to(advert_path(writable))
    with pytest.raises(UntrustedPath, match="symlink"):
        read_advert(linked)


def test_the_daemon_writes_its_advert_without_following_planted_links(shared: Path) -> None:
    """A symlink nobody planted at the advert's path is replaced, never written through, and no
    temporary file is left behind."""
    victim_file = shared / "victim.txt"
    victim_file.write_text("precious")
    sock = shared / "kerneld.sock"
    as_nobody(lambda: advert_path(sock).symlink_to(victim_file))
    advert = Advert(shared / "store", shared / "store/index/v1", sock, shared / "a.sock", 7, "0")
    write_advert(advert)
    assert victim_file.read_text() == "precious"
    assert not advert_path(sock).is_symlink()
    back = read_advert(sock)
    assert back is not None and back.pid == 7
    assert sorted(p.name for p in shared.iterdir()) == ["kerneld.sock.json", "victim.txt"]


# ------------------------------------------------------------------------------- who is trusted


def test_a_store_of_the_daemon_user_is_trusted_by_every_user(shared: Path) -> None:
    """The system daemon (`User=kerneld`): its store is trusted by root and by any other user,
    in a sticky directory too; its advert as well."""
    uid = _daemon_uid()
    if uid is None:
        pytest.skip("no system user kerneld on this host")
    store = shared / "store"
    store.mkdir(mode=0o755)
    os.chown(store, uid, uid)
    sock = shared / "kerneld.sock"
    advert_path(sock).write_text(
        Advert(store, store / "index/v1", sock, shared / "a.sock", 1, "0").to_json()
    )
    advert_path(sock).chmod(0o644)
    os.chown(advert_path(sock), uid, uid)
    assert _path_trust.store_root(store).owner_uid == uid

    def check() -> list[object]:
        advert = read_advert(sock)
        return [_path_trust.store_root(store).owner_uid, advert and str(advert.store_root)]

    assert as_nobody(check) == [uid, str(store)]


def test_a_user_mode_store_is_trusted_by_its_user_only(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user-mode daemon run by nobody in nobody's own directory: nobody's processes trust
    it; root's do not, unless KERNELD_STORE_OWNER names nobody."""
    home = shared / "home"
    store = home / "store"

    def make() -> int:
        home.mkdir(mode=0o700)
        store.mkdir(mode=0o755)
        return _path_trust.store_root(store).owner_uid

    assert as_nobody(make) == NOBODY.pw_uid
    monkeypatch.delenv("KERNELD_STORE_OWNER", raising=False)
    with pytest.raises(UntrustedPath, match=f"owned by uid {NOBODY.pw_uid}"):
        _path_trust.store_root(store)
    monkeypatch.setenv("KERNELD_STORE_OWNER", NOBODY.pw_name)
    assert _path_trust.store_root(store).owner_uid == NOBODY.pw_uid
    monkeypatch.setenv("KERNELD_STORE_OWNER", str(NOBODY.pw_uid))
    assert _path_trust.store_root(store).owner_uid == NOBODY.pw_uid


def test_a_trusted_store_in_a_sticky_directory_still_loads(shared: Path, tmp_path: Path) -> None:
    """The control: root's store (the daemon's) in the same world-writable sticky directory
    is used, so the refusals above are about who made the store, not where it is."""
    marker = shared / "ran"
    files = {"__init__.py": f"open({str(marker)!r}, 'w').write('x')\nKID = 'ok'\n".encode()}
    files["metadata.json"] = synthetic_metadata(
        files, kid="_sec_trusted", name="trusted", backend={"type": "cpu"}
    )
    store = shared / "store"
    publish_synthetic(store, REPO, COMMIT, {VARIANT: files}, refs={"v1": COMMIT})
    out = _victim(tmp_path, store)
    assert out.get("kid") == "ok", out
    assert marker.exists()
    doc = json.loads((store / "index/v1/kerneld-sec/planted.json").read_text())
    assert doc["repo"] == REPO
