"""scripts/venv_bytecode.py: the bootstrap's bytecode, restored from an earlier compile of the
same files, is what compiling them today gives; a changed file and an editable install's files
are compiled, never restored."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
import os
import py_compile
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support.daemon import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "venv_bytecode.py"
SOURCES = {
    "demo/__init__.py": "from demo.mod import VALUE\n",
    "demo/mod.py": "VALUE = 1\n",
}
FINDER = "__editable___ed_0_1_finder.py"


def _record_line(site: Path, name: str) -> str:
    data = (site / name).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _script_line(venv: Path) -> str:
    """The RECORD line of the distribution's script in the venv's bin/: its shebang names the
    venv, so every venv's line differs."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(str(venv).encode()).digest())
    return f"../../../bin/demo,sha256={digest.rstrip(b'=').decode()},200"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    for name, text in SOURCES.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    (site / FINDER).write_text(f"CHECKOUT = {str(tmp_path)!r}\n")
    demo = site / "demo-1.0.dist-info"
    demo.mkdir()
    (demo / "RECORD").write_text(
        "\n".join(
            [
                *(_record_line(site, n) for n in SOURCES),
                _script_line(tmp_path),
                "demo-1.0.dist-info/RECORD,,",
            ]
        )
    )
    editable = site / "ed-0.1.dist-info"
    editable.mkdir()
    direct = '{"url": "file:///x", "dir_info": {"editable": true}}'
    (editable / "direct_url.json").write_text(direct)
    (editable / "RECORD").write_text(_record_line(site, FINDER) + "\n")
    return site


def _run(site: Path, cache: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(site), str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def _pyc(site: Path, name: str) -> Path:
    return Path(importlib.util.cache_from_source(str(site / name)))


def _as_compiled_today(site: Path, name: str, tmp_path: Path) -> None:
    """The pyc has the header and code `py_compile` writes for the file as it is now (marshal's
    bytes may differ between two compiles of one source; the code objects do not)."""
    expected = tmp_path / "expected.pyc"
    py_compile.compile(str(site / name), cfile=str(expected), doraise=True)
    want, have = expected.read_bytes(), _pyc(site, name).read_bytes()
    assert have[:16] == want[:16], name
    assert marshal.loads(have[16:]).co_code == marshal.loads(want[16:]).co_code, name


def test_restored_bytecode_is_todays_compile_and_changed_files_are_compiled(
    tmp_path: Path,
) -> None:
    site, cache = _site(tmp_path), tmp_path / "cache"
    assert "0 of 2 files restored" in _run(site, cache)
    (archive,) = cache.glob("*.tar")
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(SOURCES)  # not the editable install's finder
    # Mark what the cache holds: its files' code says where it was compiled ("kept"), so that
    # a file restored can be told from one compiled again.
    with tarfile.open(archive, "w") as tar:
        for name in SOURCES:
            kept = tmp_path / "kept.pyc"
            py_compile.compile(str(site / name), cfile=str(kept), dfile="kept", doraise=True)
            tar.add(kept, arcname=name)

    # The next clone: the same files, other modification times, no bytecode; one file edited
    # in place (same size), so its RECORD hash no longer holds.
    for pyc in site.rglob("*.pyc"):
        pyc.unlink()
    for name in [*SOURCES, FINDER]:
        st = (site / name).stat()
        os.utime(site / name, (st.st_atime + 1000, st.st_mtime + 1000))
    (site / "demo/mod.py").write_text("VALUE = 2\n")
    record = site / "demo-1.0.dist-info" / "RECORD"  # another venv: another script line
    text = record.read_text()
    record.write_text(text.replace(_script_line(tmp_path), _script_line(tmp_path / "other")))
    assert "1 of 2 files restored" in _run(site, cache)
    for name in [*SOURCES, FINDER]:
        _as_compiled_today(site, name, tmp_path)
    compiled_in = {n: marshal.loads(_pyc(site, n).read_bytes()[16:]).co_filename for n in SOURCES}
    # the unchanged file's pyc is the kept one, its header today's (compileall left it alone);
    # the edited one was compiled
    assert compiled_in == {"demo/__init__.py": "kept", "demo/mod.py": str(site / "demo/mod.py")}
    imported = subprocess.run(
        [sys.executable, "-c", "import demo; print(demo.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert imported.stdout.strip() == "2"


def test_an_unreadable_cache_entry_means_compiling(tmp_path: Path) -> None:
    site, cache = _site(tmp_path), tmp_path / "cache"
    _run(site, cache)
    (archive,) = cache.glob("*.tar")
    archive.write_bytes(b"not a tar")
    for pyc in site.rglob("*.pyc"):
        pyc.unlink()
    out = _run(site, cache)
    assert "0 of 2 files restored" in out
    for name in SOURCES:
        _as_compiled_today(site, name, tmp_path)
