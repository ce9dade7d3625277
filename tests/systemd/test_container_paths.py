"""The systemd tests' container sees a checkout at any path (issue 55).

A contributor's clone may sit several folders deep under /tmp, where the container has a tmpfs
of its own, in a folder whose name has a space or a colon. The test clones this checkout to such
a path, boots the container the install test uses with that clone as its repository, and runs
the clone's files from inside: readable at their host path, and what the container writes there
stays in the container.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import REPO_ROOT
from tests.systemd.container import Container, ContainerUnavailable, unavailable_reason

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(300)]

#: Below /tmp (the container's own tmpfs), three folders deep, a space and a colon on the way.
NESTED = ("a b", "c:d", "kd")


@pytest.fixture
def nested_clone() -> Iterator[Path]:
    """A `git clone --shared` of this checkout at <new folder under /tmp>/a b/c:d/kd."""
    top = Path(tempfile.mkdtemp(prefix="kd-nested-", dir="/tmp"))
    clone = top.joinpath(*NESTED)
    clone.parent.mkdir(parents=True)
    try:
        done = subprocess.run(
            ["git", "clone", "--quiet", "--shared", str(REPO_ROOT), str(clone)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"git clone failed:\n{done.stderr}"
        yield clone
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.slow
def test_a_clone_nested_under_tmp_with_a_space_and_a_colon_is_seen_in_the_container(
    nested_clone: Path, tmp_path: Path
) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with Container(tmp_path / "c", f"kdp-{os.getpid()}", repository=nested_clone) as c:
        try:
            c.mount()
        except ContainerUnavailable as exc:
            pytest.skip(str(exc))
        c.boot()
        # The clone's own files, run by the container's python from the clone as working
        # folder, as the docs' install block runs `pip install ./client .` from it.
        script = (
            "import pathlib, tomllib\n"
            "meta = tomllib.loads(pathlib.Path('pyproject.toml').read_text())\n"
            "unit = pathlib.Path('systemd/kerneld.service').read_text()\n"
            "pathlib.Path('written-in-the-container').write_text('x')\n"
            "print(meta['project']['name'], 'ExecStart=' in unit, pathlib.Path.cwd())\n"
        )
        ran = c.run(
            ["sh", "-c", 'cd "$1" && exec python3 -c "$2"', "sh", str(nested_clone), script]
        )
        assert ran.rc == 0, f"the clone is not usable in the container:\n{ran}\n{c.tail()}"
        assert ran.out.split() == ["kerneld", "True", *str(nested_clone).split()], str(ran)
    assert not (nested_clone / "written-in-the-container").exists(), (
        "the container wrote into the host's checkout"
    )
