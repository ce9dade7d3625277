"""Marking layers as kernelizable: `use_kernel_forward_from_hub` and friends.

The marks are the class attributes `kernels` uses (`kernel_layer_name`, `kernel_condition`;
_marks.py), so a model decorated with `kernels`' decorators is kernelized by kerneld's
`kernelize` and vice versa, and libraries that already carry `kernels` marks (transformers' hub
layers) need no change. A marked *function*, and `use_kernelized_func`, are _kernel_funcs.py's.

Marking a class imports nothing (no torch): the decorator only sets attributes. Decorating a
*function* turns it into an `nn.Module` instance, which needs torch at decoration time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from kerneld_client.layers._kernel_funcs import kernel_function_class
from kerneld_client.layers._marks import CONDITION_ATTR, LAYER_NAME_ATTR

__all__ = [
    "replace_kernel_forward_from_hub",
    "use_kernel_forward_from_hub",
]

_T = TypeVar("_T")


def _always(module: Any) -> bool:
    return True


def replace_kernel_forward_from_hub(
    cls: type[Any], layer_name: str, condition: Callable[[Any], bool] | None = None
) -> None:
    """Make an existing (e.g. third-party) layer class kernelizable under `layer_name`.

    Prefer the decorator on classes you own: this relies on the class's attributes and
    `forward` signature, which its authors may change.
    """
    if not isinstance(layer_name, str) or not layer_name:
        raise TypeError(f"layer_name must be a non-empty string, got {layer_name!r}")
    setattr(cls, LAYER_NAME_ATTR, layer_name)
    # A staticmethod, so access through an instance does not bind the module as `self`.
    setattr(cls, CONDITION_ATTR, staticmethod(condition if condition is not None else _always))


def use_kernel_forward_from_hub(
    layer_name: str, condition: Callable[[Any], bool] | None = None
) -> Callable[[_T], _T]:
    """Mark a layer class (or a function) as replaceable by the kernel layer `layer_name`.

    Nothing changes until `kernelize`. `condition(module)` is asked per instance at kernelize
    time; False keeps that instance on PyTorch. On a function, the result is an `nn.Module`
    instance that calls the function (attach it with `use_kernelized_func` so `kernelize` sees
    it); calling it still works like calling the function.
    """

    def decorator(obj: _T) -> _T:
        if inspect.isclass(obj):
            replace_kernel_forward_from_hub(obj, layer_name, condition)
            return obj
        if inspect.isfunction(obj):
            cls = kernel_function_class(obj)
            replace_kernel_forward_from_hub(cls, layer_name, condition)
            return cls()  # type: ignore[return-value]
        raise TypeError("@use_kernel_forward_from_hub can only be applied to classes or functions")

    return decorator
