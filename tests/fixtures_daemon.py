"""Pytest plugin: the real kerneld daemon as a subprocess (see tests/support/daemon.py).

- `make_daemon(**kwargs)`: start a `DaemonProcess` in this test's tmp dir (stopped at teardown,
  whatever the test did); kwargs as for `DaemonProcess`.
- `kernel_mirror`: a session-wide kerneld mirror directory with small kernels whose variants
  cover CPU, CUDA, ROCm, XPU and noarch builds (see `MIRROR_KERNELS`), for tests that need no Hub.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import REPO_ROOT, DaemonProcess, default_user
from tests.support.mirrors import variant, write_mirror

ACT = "kerneld-test/act"
"""v1: CPU torch 2.13 + noarch universal; v2: CUDA 12.8 and 13.0 builds only."""
MULTI = "kerneld-test/multi"
"""v1: builds for every backend and two torch versions (prefetch/GPU selection)."""
DEP_TOP = "kerneld-test/top"
DEP_BOTTOM = "kerneld-test/bottom"
C1, C2, C3 = "1" * 40, "2" * 40, "3" * 40

MULTI_VARIANTS = (
    "torch212-cxx11-cpu-x86_64-linux",
    "torch213-cxx11-cpu-x86_64-linux",
    "torch213-cxx11-cu126-x86_64-linux",
    "torch213-cxx11-cu128-x86_64-linux",
    "torch213-cxx11-cu130-x86_64-linux",
    "torch212-cxx11-cu128-x86_64-linux",
    "torch213-cxx11-rocm63-x86_64-linux",
    "torch213-cxx11-rocm64-x86_64-linux",
    "torch213-cxx11-xpu20252-x86_64-linux",
    "torch213-cxx11-cpu-aarch64-linux",
    "torch-cpu",
    "torch-cuda",
    "torch-rocm",
    "torch-xpu",
    "torch-universal",
)


def _ident(repo: str, name: str) -> str:
    return "_" + (repo.split("/")[1] + "_" + name).replace("-", "_").replace(".", "_")


def _backend(name: str) -> str:
    """The metadata.json backend type of a variant name."""
    for token, backend in (("rocm", "rocm"), ("xpu", "xpu"), ("-cu", "cuda"), ("cuda", "cuda")):
        if token in name:
            return backend
    return "cpu"


def mirror_kernels() -> dict[str, dict[str, dict[str, dict[str, bytes]]]]:
    return {
        ACT: {
            C1: {
                "torch213-cxx11-cpu-x86_64-linux": variant(_ident(ACT, "cpu213")),
                "torch-universal": variant(_ident(ACT, "universal")),
            },
            C2: {
                "torch213-cxx11-cu128-x86_64-linux": variant(_ident(ACT, "cu128"), backend="cuda"),
                "torch213-cxx11-cu130-x86_64-linux": variant(_ident(ACT, "cu130"), backend="cuda"),
            },
        },
        MULTI: {
            C1: {
                name: variant(_ident(MULTI, name), backend=_backend(name))
                for name in MULTI_VARIANTS
            }
        },
        DEP_TOP: {
            C1: {
                "torch-universal": variant(
                    _ident(DEP_TOP, "u"), depends=[{"repo-id": DEP_BOTTOM, "version": 1}]
                )
            }
        },
        DEP_BOTTOM: {C1: {"torch-universal": variant(_ident(DEP_BOTTOM, "u"))}},
    }


MIRROR_BRANCHES = {
    ACT: {"v1": C1, "v2": C2, "main": C1},
    MULTI: {"v1": C1},
    DEP_TOP: {"v1": C1},
    DEP_BOTTOM: {"v1": C1},
}


def build_kernel_mirror(root: Path) -> Path:
    write_mirror(root, mirror_kernels(), branches=MIRROR_BRANCHES)
    return root


def pytest_configure(config: pytest.Config) -> None:
    """Root runs: a private base temp directory per session, outside /tmp/pytest-of-root.

    Test daemons run as another user, so the directories above their work dirs get the search
    bit (`grant_traversal`); pytest resets /tmp/pytest-of-root to 0700 whenever a session starts,
    so a second pytest run on the machine would lock the first one's daemons out mid-run.
    """
    if default_user() is None or config.option.basetemp or hasattr(config, "workerinput"):
        return
    base = Path(tempfile.mkdtemp(prefix="kerneld-tests-"))
    config.option.basetemp = str(base / "t")
    config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Test daemons run as an unprivileged user: it must be able to run this interpreter and
    import this checkout, or hundreds of tests fail for one reason. Say that reason once."""
    user = default_user()
    if user is None:
        return
    probe = [sys.executable, "-c", "import kerneld.server.main, kerneld_client"]
    try:
        subprocess.run(probe, user=user, cwd=REPO_ROOT, check=True, capture_output=True, timeout=60)
    except (OSError, KeyError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.exit(
            f"test daemons run as the unprivileged user {user!r}, which cannot run "
            f"{sys.executable} or import this checkout ({exc!r}; {detail.decode()[-300:]}). "
            "Run scripts/bootstrap as root (it creates the user and a venv from the "
            "distribution's python3), and keep the checkout where other users can traverse "
            "(.ci/run grants that to its parent directories).",
            returncode=3,
        )


@pytest.fixture(scope="session")
def kernel_mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_kernel_mirror(tmp_path_factory.mktemp("kernel-mirror") / "mirror")


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def make(name: str = "daemon", *, start: bool = True, **kwargs: Any) -> DaemonProcess:
        daemon = DaemonProcess(tmp_path / name, **kwargs)
        started.append(daemon)
        return daemon.start() if start else daemon

    yield make
    for daemon in reversed(started):
        daemon.close()
