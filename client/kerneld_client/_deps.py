"""Kernel dependencies as the kernel being imported sees them (`get_kernel_dep`).

A kernel whose `metadata.json` lists `kernel-depends` may ask for those modules while its
`__init__` runs. The loader imports the dependencies first and makes them visible here for the
length of the import, in a context variable (threads and asyncio tasks that load kernels side
by side each see their own). When `kernels` is installed the same modules are also handed to
`kernels.get_kernel_dep`, since kernels built with kernel-builder call that one.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Mapping
from types import ModuleType

from kerneld_client._loads import DEPENDENCIES as _CURRENT

__all__ = ["get_kernel_dep", "providing"]


@contextlib.contextmanager
def providing(deps: Mapping[str, ModuleType]) -> Iterator[None]:
    """Make `deps` (repo id -> module) the dependencies of the kernel imported in this block."""
    token = _CURRENT.set(dict(deps))
    try:
        if deps and importlib.util.find_spec("kernels") is not None:
            from kernels.deps import use_kernel_deps

            with use_kernel_deps(dict(deps)):
                yield
        else:
            yield
    finally:
        _CURRENT.reset(token)


def get_kernel_dep(repo_id: str) -> ModuleType:
    """The module of dependency `repo_id` of the kernel being imported (as in `kernels`).

    Only works while a kernel is imported; the dependency must be listed in the kernel's
    `kernel-depends` (kernel-builder's `kernel-deps`), which pins its version or revision.
    """
    deps = _CURRENT.get()
    if deps is None:
        raise RuntimeError("`get_kernel_dep` only works during kernel loading.")
    module = deps.get(repo_id)
    if module is None:
        listed = ", ".join(sorted(deps)) or "none"
        raise RuntimeError(
            f"Dependency '{repo_id}' not found in kernel dependencies (this kernel declares: "
            f"{listed}). Ensure the dependency is added to `kernel-deps` in build.toml."
        )
    return module
