"""pytest plugin: the `kernels` package's public names, answered by `kerneld_client`.

Loaded with `-p api_as_kernels` when the suite runs in the "api" configuration: before any
test module is imported, every name of `kernels.__all__` that `kerneld_client` also exports is
rebound on the `kernels` module, so `from kernels import get_kernel, kernelize, ...` in the
tests gets kerneld's. Names kerneld does not provide, and `kernels`' internal modules that some
tests import directly (`kernels.layer.layer`, `kernels._versions`, ...), stay `kernels`' own.
"""

from __future__ import annotations

from typing import Any


def pytest_configure(config: Any) -> None:
    import kernels

    import kerneld_client

    shared = set(kernels.__all__) & set(kerneld_client.__all__) - {"__version__"}
    for name in sorted(shared):
        setattr(kernels, name, getattr(kerneld_client, name))
