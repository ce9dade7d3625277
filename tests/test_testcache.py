"""The heavy set-up's cache outside the clone (tests/support/testcache.py, `make test-deps`):
where it is, that two processes making one entry make it once, and that a failed make leaves
nothing a later run would take for whole."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import REPO_ROOT
from tests.support.testcache import CACHE_ENV, cache_root, content_key, locked, staging

#: One process making entry `thing` in the cache: the first counts itself in builds.log.
MAKER = """
import sys, time
from pathlib import Path
from tests.support.testcache import cache_dir, locked, staging
dest = cache_dir("kind") / "thing"
with locked(dest):
    if not (dest / ".complete").exists():
        with staging(dest) as tmp:
            with open(Path(sys.argv[1]), "a") as log:
                log.write("built\\n")
            time.sleep(0.5)  # the other process asks meanwhile
            (tmp / "payload").write_text("whole")
            (tmp / ".complete").write_text("")
print((dest / "payload").read_text())
"""


def test_the_cache_is_the_configured_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c" and (tmp_path / "c").is_dir()


def test_make_test_finds_a_kinds_folder_by_name(tmp_path: Path) -> None:
    """`python -m tests.deps --cache-dir mypy` (the Makefile's mypy cache) prints the kind's
    folder in the configured cache, made; a kind that is not one name is refused."""
    env = {**os.environ, CACHE_ENV: str(tmp_path / "c")}
    ask = [sys.executable, "-m", "tests.deps", "--cache-dir"]
    run = subprocess.run([*ask, "mypy"], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == f"{tmp_path / 'c' / 'mypy'}\n", run.stderr
    assert (tmp_path / "c" / "mypy").is_dir()
    bad = subprocess.run([*ask, "../x"], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "a kind is one name" in bad.stderr
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["mypy"]


def test_keys_follow_every_input() -> None:
    base = content_key(["kernels==0.19.1"], "3.11")
    assert base == content_key(["kernels==0.19.1"], "3.11")
    assert base != content_key(["kernels==0.19.2"], "3.11")
    assert base != content_key(["kernels==0.19.1"], "3.12")


def test_two_processes_make_one_entry_once(tmp_path: Path) -> None:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "PYTHONPATH": str(REPO_ROOT)}
    log = tmp_path / "builds.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAKER, str(log)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [out.strip() for out, _ in outs] == ["whole", "whole"]
    assert log.read_text() == "built\n"
    assert sorted(p.name for p in (tmp_path / "cache" / "kind").iterdir()) == [
        "thing",
        "thing.lock",
    ]


def test_a_failed_make_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    dest = cache_root() / "kind" / "thing"
    with pytest.raises(RuntimeError), locked(dest), staging(dest) as tmp:
        (tmp / "half").write_text("")
        raise RuntimeError("pip failed")
    assert not dest.exists()
    assert [p.name for p in dest.parent.iterdir()] == ["thing.lock"]


def test_a_hook_venv_of_another_clone_shares_all_but_its_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv with this checkout's client is layered (tests/hubapi/venvs.py): another clone
    makes only its own client layer and reuses the third-party one, and runs its own code."""
    from tests.hubapi import venvs

    ours = venvs.make_venv(
        venvs.venv_root(), ["kernels==0.19.1", venvs.CLIENT_REQUIREMENT], name="hook-kernels-0.19.1"
    )
    other = tmp_path / "x" / "y" / "z" / "kd" / "client"
    shutil.copytree(venvs.CLIENT, other, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    monkeypatch.setattr(venvs, "CLIENT", other)
    monkeypatch.setattr(venvs, "CLIENT_REQUIREMENT", f"--editable={other}")
    theirs = venvs.make_venv(
        venvs.venv_root(), ["kernels==0.19.1", venvs.CLIENT_REQUIREMENT], name="hook-kernels-0.19.1"
    )
    made = [theirs.parent.parent, venvs._client_layer(venvs.venv_root()).parent.parent]
    try:
        assert theirs != ours

        def layers(python: Path) -> list[str]:
            pth = Path(venvs.purelib(python)) / "00-kerneld-test-layers.pth"
            return re.findall(r"addsitedir\('([^']+)'\)", pth.read_text())

        assert layers(theirs)[0] == layers(ours)[0]  # the third-party layer is shared
        assert layers(theirs)[1] != layers(ours)[1]  # the client layer is each clone's own
        code = "import kerneld_client, kernels; print(kerneld_client.__file__, kernels.__version__)"
        for python, client in ((ours, REPO_ROOT / "client"), (theirs, other)):
            out = subprocess.run(
                [str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True
            ).stdout.split()
            assert out == [str(client / "kerneld_client" / "__init__.py"), "0.19.1"]
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
