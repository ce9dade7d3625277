"""kerneld_client: load Kernel Hub kernels through the host's kerneld daemon.

Importing this package is cheap on purpose: it imports neither grpc, huggingface_hub, torch nor
kerneld. The public names below are resolved on first use (module `__getattr__`), so
`import kerneld_client` costs a few milliseconds and `kerneld_client.get_kernel` pulls in only
the warm path; grpc is imported only if the daemon has to be asked.
"""

from __future__ import annotations

import importlib
import os
import sys

# Not `from typing import TYPE_CHECKING`: typing costs milliseconds in a bare interpreter.
TYPE_CHECKING = False

__version__ = "0.1.0"

#: Set in a child forked after grpc was imported, by kerneld or by any other library: gRPC can
#: hang for ever in such a child, so `_daemon_gate` never asks kerneld from it. Kept here, not
#: in `_daemon_gate` (imported only with the RPC path), so that the fact is noted from the
#: package's import on, whoever imported grpc.
_forked_after_grpc = False


def _after_fork_in_child() -> None:
    global _forked_after_grpc
    _forked_after_grpc = _forked_after_grpc or "grpc" in sys.modules


os.register_at_fork(after_in_child=_after_fork_in_child)

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "LoadedKernel": "kerneld_client.loader",
    "get_kernel": "kerneld_client._warm",
    "get_kernel_variants": "kerneld_client.variant_verdicts",
    "get_loaded_kernels": "kerneld_client.loader",
    "get_local_kernel": "kerneld_client.loader",
    "get_locked_kernel": "kerneld_client.loader",
    "has_kernel": "kerneld_client.loader",
    "load_kernel": "kerneld_client.loader",
    "loaded_kernels": "kerneld_client.loader",
    "get_kernel_dep": "kerneld_client._deps",
    "report_suspect": "kerneld_client._report",
    "RepoInfo": "kerneld_client.repo_info",
    "SuspectReport": "kerneld_client._types",
    "FallbackPolicy": "kerneld_client.loading.fallback",
    "KernelFallbackWarning": "kerneld_client._config",
    "CorruptTree": "kerneld_client.errors",
    "DaemonUnavailable": "kerneld_client.errors",
    "DependencyMissing": "kerneld_client.errors",
    "KernelDenied": "kerneld_client.errors",
    "KernelError": "kerneld_client.errors",
    "KernelLoadError": "kerneld_client.errors",
    "KernelNotFound": "kerneld_client.errors",
    "KernelUnavailable": "kerneld_client.errors",
    "NoCompatibleVariant": "kerneld_client.errors",
    "RevisionNotFound": "kerneld_client.errors",
    "UntrustedPath": "kerneld_client.errors",
    "UntrustedPublisher": "kerneld_client.errors",
    "VariantReason": "kerneld_client.errors",
    "VersionNotFound": "kerneld_client.errors",
    "platform_facts": "kerneld_client.platform",
    "set_platform_facts": "kerneld_client.platform",
    "Decision": "kerneld_client.variants",
    "PlatformFacts": "kerneld_client.variants",
    # the layer API (same names as the `kernels` package)
    "CUDAProperties": "kerneld_client.layers",
    "Device": "kerneld_client.layers",
    "FuncRepository": "kerneld_client.layers",
    "KernelizeFallback": "kerneld_client.layers",
    "KernelizeReport": "kerneld_client.layers",
    "LayerRepository": "kerneld_client.layers",
    "LocalFuncRepository": "kerneld_client.layers",
    "LocalLayerRepository": "kerneld_client.layers",
    "LockedFuncRepository": "kerneld_client.layers",
    "LockedLayerRepository": "kerneld_client.layers",
    "Mode": "kerneld_client.layers",
    "ROCMProperties": "kerneld_client.layers",
    "kernelize": "kerneld_client.layers",
    "kernelize_report": "kerneld_client.layers",
    "register_kernel_mapping": "kerneld_client.layers",
    "replace_kernel_forward_from_hub": "kerneld_client.layers",
    "unkernelize": "kerneld_client.layers",
    "use_kernel_forward_from_hub": "kerneld_client.layers",
    "use_kernel_func_from_hub": "kerneld_client.layers",
    "use_kernel_mapping": "kerneld_client.layers",
    "use_kernelized_func": "kerneld_client.layers",
    # the rest of `kernels`' public names (issue 40)
    "Benchmark": "kerneld_client.benchmark",
    "Metadata": "kerneld_client.kernel_metadata",
    "VariantAccepted": "kerneld_client.variant_verdicts",
    "VariantRejected": "kerneld_client.variant_verdicts",
    "install_kernel": "kerneld_client.install",
    "KernelizedFunc": "kerneld_client.layers",
    "KernelizedLayer": "kerneld_client.layers",
    "KernelizedLayers": "kerneld_client.layers",
    "get_kernelized_layers": "kerneld_client.layers",
}

__all__ = [
    "Benchmark",
    "CUDAProperties",
    "CorruptTree",
    "DaemonUnavailable",
    "Decision",
    "DependencyMissing",
    "Device",
    "FallbackPolicy",
    "FuncRepository",
    "KernelDenied",
    "KernelError",
    "KernelFallbackWarning",
    "KernelLoadError",
    "KernelNotFound",
    "KernelUnavailable",
    "KernelizeFallback",
    "KernelizeReport",
    "KernelizedFunc",
    "KernelizedLayer",
    "KernelizedLayers",
    "LayerRepository",
    "LoadedKernel",
    "LocalFuncRepository",
    "LocalLayerRepository",
    "LockedFuncRepository",
    "LockedLayerRepository",
    "Metadata",
    "Mode",
    "NoCompatibleVariant",
    "PlatformFacts",
    "ROCMProperties",
    "RepoInfo",
    "RevisionNotFound",
    "SuspectReport",
    "UntrustedPath",
    "UntrustedPublisher",
    "VariantAccepted",
    "VariantReason",
    "VariantRejected",
    "VersionNotFound",
    "__version__",
    "get_kernel",
    "get_kernel_dep",
    "get_kernel_variants",
    "get_kernelized_layers",
    "get_loaded_kernels",
    "get_local_kernel",
    "get_locked_kernel",
    "has_kernel",
    "install_kernel",
    "kernelize",
    "kernelize_report",
    "load_kernel",
    "loaded_kernels",
    "platform_facts",
    "register_kernel_mapping",
    "replace_kernel_forward_from_hub",
    "report_suspect",
    "set_platform_facts",
    "unkernelize",
    "use_kernel_forward_from_hub",
    "use_kernel_func_from_hub",
    "use_kernel_mapping",
    "use_kernelized_func",
]

if TYPE_CHECKING:
    from typing import Any

    from kerneld_client._config import KernelFallbackWarning
    from kerneld_client._deps import get_kernel_dep
    from kerneld_client._report import report_suspect
    from kerneld_client._types import SuspectReport
    from kerneld_client._warm import get_kernel
    from kerneld_client.benchmark import Benchmark
    from kerneld_client.errors import (
        CorruptTree,
        DaemonUnavailable,
        DependencyMissing,
        KernelDenied,
        KernelError,
        KernelLoadError,
        KernelNotFound,
        KernelUnavailable,
        NoCompatibleVariant,
        RevisionNotFound,
        UntrustedPath,
        UntrustedPublisher,
        VariantReason,
        VersionNotFound,
    )
    from kerneld_client.install import install_kernel
    from kerneld_client.kernel_metadata import Metadata
    from kerneld_client.layers import (
        CUDAProperties,
        Device,
        FuncRepository,
        KernelizedFunc,
        KernelizedLayer,
        KernelizedLayers,
        KernelizeFallback,
        KernelizeReport,
        LayerRepository,
        LocalFuncRepository,
        LocalLayerRepository,
        LockedFuncRepository,
        LockedLayerRepository,
        Mode,
        ROCMProperties,
        get_kernelized_layers,
        kernelize,
        kernelize_report,
        register_kernel_mapping,
        replace_kernel_forward_from_hub,
        unkernelize,
        use_kernel_forward_from_hub,
        use_kernel_func_from_hub,
        use_kernel_mapping,
        use_kernelized_func,
    )
    from kerneld_client.loader import (
        LoadedKernel,
        get_loaded_kernels,
        get_local_kernel,
        get_locked_kernel,
        has_kernel,
        load_kernel,
        loaded_kernels,
    )
    from kerneld_client.loading.fallback import FallbackPolicy
    from kerneld_client.platform import platform_facts, set_platform_facts
    from kerneld_client.repo_info import RepoInfo
    from kerneld_client.variant_verdicts import (
        VariantAccepted,
        VariantRejected,
        get_kernel_variants,
    )
    from kerneld_client.variants import Decision, PlatformFacts


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kerneld_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
