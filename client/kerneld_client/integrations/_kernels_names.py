"""The public names of the `kernels` package, and the `kerneld_client` object that serves each.

The start-up hook binds every name of a `kernels` release's `__all__` to the object listed
here, in the `kernels` module itself (`kernels.get_kernel = kerneld_client.get_kernel`): code
that imports them (`from kernels import kernelize`, as Transformers does) gets kerneld's, and
nothing of `kernels`' private modules is read or changed, so a release that moves them (0.19
moved all of them under `kernels._internals`) changes nothing here. A name missing from this
table is one the hook cannot serve: `install()` then leaves the whole release alone.

Every object here has its `kernels` namesake's signature and meaning (tests/compat checks the
signatures against each release); the differences are in docs/kernels-compatibility.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SERVED", "implementation", "unserved"]

_LAYERS = "kerneld_client.layers"
_LOADER = "kerneld_client.loader"

#: `kernels` public name -> the kerneld_client module whose attribute of the same name serves it
#: (0.17.2 has 34 names, 0.18.3 and 0.19.1 add the four `Kernelized*` / `get_kernelized_layers`).
SERVED: dict[str, str] = {
    "Benchmark": "kerneld_client.benchmark",
    "CUDAProperties": _LAYERS,
    "Device": _LAYERS,
    "FuncRepository": _LAYERS,
    "KernelizeFallback": _LAYERS,
    "KernelizedFunc": _LAYERS,
    "KernelizedLayer": _LAYERS,
    "KernelizedLayers": _LAYERS,
    "LayerRepository": _LAYERS,
    "LoadedKernel": _LOADER,
    "LocalFuncRepository": _LAYERS,
    "LocalLayerRepository": _LAYERS,
    "LockedFuncRepository": _LAYERS,
    "LockedLayerRepository": _LAYERS,
    "Metadata": "kerneld_client.kernel_metadata",
    "Mode": _LAYERS,
    "ROCMProperties": _LAYERS,
    "RepoInfo": "kerneld_client.repo_info",
    "VariantAccepted": "kerneld_client.variant_verdicts",
    "VariantRejected": "kerneld_client.variant_verdicts",
    "get_kernel": _LOADER,
    "get_kernel_dep": "kerneld_client._deps",
    "get_kernel_variants": "kerneld_client.variant_verdicts",
    "get_kernelized_layers": _LAYERS,
    "get_loaded_kernels": _LOADER,
    "get_local_kernel": _LOADER,
    "get_locked_kernel": _LOADER,
    "has_kernel": _LOADER,
    "install_kernel": "kerneld_client.install",
    "kernelize": _LAYERS,
    "load_kernel": _LOADER,
    "register_kernel_mapping": _LAYERS,
    "replace_kernel_forward_from_hub": _LAYERS,
    "use_kernel_forward_from_hub": _LAYERS,
    "use_kernel_func_from_hub": _LAYERS,
    "use_kernel_mapping": _LAYERS,
    "use_kernelized_func": _LAYERS,
}

#: Names of `__all__` that are not served (the value stays `kernels`' own).
_NOT_BOUND = frozenset({"__version__"})


def unserved(public: list[str]) -> list[str]:
    """The names of a release's `__all__` that this table cannot serve."""
    return sorted(n for n in public if n not in SERVED and n not in _NOT_BOUND)


def implementation(name: str) -> Any:
    """The kerneld_client object that serves `kernels.<name>`."""
    return getattr(importlib.import_module(SERVED[name]), name)


def bound_names(public: list[str]) -> list[str]:
    """The names of a release's `__all__` the hook binds."""
    return [n for n in public if n in SERVED]
