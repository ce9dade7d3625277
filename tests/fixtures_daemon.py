"""Pytest plugin: the real kerneld daemon as a subprocess (see tests/support/daemon.py).

- `make_daemon(**kwargs)`: start a `DaemonProcess` in this test's tmp dir (stopped at teardown,
  whatever the test did); kwargs as for `DaemonProcess`.
- `kernel_mirror`: a session-wide kerneld mirror directory with small kernels whose variants
  cover CPU, CUDA, ROCm, XPU and noarch builds (see `MIRROR_KERNELS`), for tests that need no Hub.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
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
