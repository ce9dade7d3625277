"""`get_kernelized_layers`: which layers and attached functions of a model run a kernel now, and
from which repository (`kernels` 0.18's `KernelizedLayers`, with its dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kerneld_client.layers._marks import FUNCS_ATTR
from kerneld_client.layers._swap import REPO_ATTR

if TYPE_CHECKING:
    from torch import nn

__all__ = ["KernelizedFunc", "KernelizedLayer", "KernelizedLayers", "get_kernelized_layers"]


@dataclass(frozen=True)
class KernelizedLayer:
    """A kernelized layer and the repository its kernel came from."""

    module: nn.Module
    repo: Any


@dataclass(frozen=True)
class KernelizedFunc:
    """A kernelized function (the module wrapping it) and the repository its kernel came from."""

    module: nn.Module
    repo: Any


@dataclass(frozen=True)
class KernelizedLayers:
    """The kernels a kernelized model uses: `layers` by `named_modules` name, `funcs` by
    (name of the module the function is attached to, the function's name)."""

    layers: dict[str, KernelizedLayer] = field(default_factory=dict)
    funcs: dict[tuple[str, str], KernelizedFunc] = field(default_factory=dict)


def get_kernelized_layers(model: nn.Module) -> KernelizedLayers:
    """The repositories of the kernel layers and functions `model` uses now (after
    `kernelize`; a layer that kept its PyTorch forward, or was unkernelized, is not listed)."""
    found = KernelizedLayers()
    for name, module in model.named_modules():
        repo = module.__dict__.get(REPO_ATTR)
        if repo is not None:
            found.layers[name] = KernelizedLayer(module, repo)
        for func_name, func in dict(module.__dict__.get(FUNCS_ATTR, {})).items():
            func_repo = getattr(func, "__dict__", {}).get(REPO_ATTR)
            if func_repo is not None:
                found.funcs[(name, func_name)] = KernelizedFunc(func, func_repo)
    return found
