"""The systemd install test's wheelhouse: kerneld's and kerneld-client's dependencies as wheels
for the container's python3, so the docs' `pip install ./client .` runs offline (issue 55: made
by `make test-deps` into the suite's cache outside the clone, tests/support/testcache.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.daemon import REPO_ROOT
from tests.support.testcache import cache_dir
from tests.systemd.container import BASE_ENV

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The container's `python3` is this machine's (the overlay's lower layer is the host root).
BASE_PYTHON = shutil.which("python3", path=BASE_ENV["PATH"]) or "python3"


def base_python_version() -> str:
    """`major.minor` of BASE_PYTHON, as the container reports its `python3`."""
    done = subprocess.run(
        [BASE_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


def wheelhouse(python: str | None = None) -> Path:
    """Wheels of kerneld's dependencies and build backend for the container's `python3`
    (version `python`, `base_python_version()` by default), so the docs' `pip install
    ./client .` runs offline and fast; made once.

    Made with that same interpreter (a throw-away venv on the host, whose /usr is the
    container's), since binary wheels must match it and some dependencies are sdists."""
    python = python or base_python_version()
    reqs: list[str] = []
    for project in (REPO_ROOT, REPO_ROOT / "client"):  # kerneld and the kerneld-client it needs
        meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
        reqs += meta["project"]["dependencies"] + meta["build-system"]["requires"]
    reqs = sorted({r for r in reqs if not r.startswith("kerneld-client")})  # built from client/
    key = hashlib.sha256(json.dumps([python, reqs]).encode()).hexdigest()[:16]
    cache = cache_dir("systemd-wheels")
    dest = cache / key
    if (dest / ".complete").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        for argv in (
            [BASE_PYTHON, "-m", "venv", str(tmp / "venv")],
            # --use-pep517: Debian 12's pip (23.0.1) would build an sdist-only project (sdnotify)
            # with `setup.py bdist_wheel`, which needs a `wheel` its venv does not have.
            [str(tmp / "venv" / "bin" / "pip"), "wheel", "--quiet", "--disable-pip-version-check",
             "--use-pep517", "--wheel-dir", str(tmp / "wheels"), *reqs],
        ):  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
        (tmp / "wheels" / ".complete").write_text("")
        with contextlib.suppress(OSError):  # another session made it meanwhile
            (tmp / "wheels").rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
