"""Marking layers as kernelizable: `use_kernel_forward_from_hub` and friends.

The marks are the class attributes `kernels` uses (`kernel_layer_name`, `kernel_condition`)
and the instance attribute `_kernel_funcs` of `use_kernelized_func`, so a model decorated with
`kernels`' decorators is kernelized by kerneld's `kernelize` and vice versa, and libraries that
already carry `kernels` marks (transformers' hub layers) need no change.

Marking a class imports nothing (no torch): the decorator only sets attributes. Decorating a
*function* turns it into an `nn.Module` instance, which needs torch at decoration time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "CONDITION_ATTR",
    "FUNCS_ATTR",
    "LAYER_NAME_ATTR",
    "replace_kernel_forward_from_hub",
    "use_kernel_forward_from_hub",
    "use_kernelized_func",
]

#: Class attribute holding the layer name kernel mappings are keyed by (same as `kernels`).
LAYER_NAME_ATTR = "kernel_layer_name"
#: Class attribute holding the per-instance condition (a staticmethod, same as `kernels`).
CONDITION_ATTR = "kernel_condition"
#: Instance attribute (in `__dict__`, not a submodule) of `use_kernelized_func` functions.
FUNCS_ATTR = "_kernel_funcs"

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


def _function_module(func: Callable[..., Any]) -> type[nn.Module]:
    """An `nn.Module` class whose forward calls `func`, with `func`'s signature (plus `self`),
    so a hub layer replacing it is checked against the function's parameters."""
    from torch import nn

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    sig = inspect.signature(func)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[self_param, *sig.parameters.values()]
    )
    forward.__name__ = "forward"
    forward.__doc__ = func.__doc__
    namespace: dict[str, Any] = {
        "forward": forward,
        "has_backward": getattr(func, "has_backward", True),
        "can_torch_compile": getattr(func, "can_torch_compile", False),
        "__module__": getattr(func, "__module__", __name__),
        "__doc__": func.__doc__,
    }
    name = getattr(func, "__name__", "Func")
    return type(name, (nn.Module,), namespace)


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
            cls = _function_module(obj)
            replace_kernel_forward_from_hub(cls, layer_name, condition)
            return cls()  # type: ignore[return-value]
        raise TypeError("@use_kernel_forward_from_hub can only be applied to classes or functions")

    return decorator


def use_kernelized_func(*funcs: Any) -> Callable[[type[_T]], type[_T]]:
    """Attach functions decorated with `use_kernel_forward_from_hub` to every instance of the
    decorated module class (as plain attributes, not submodules), so `kernelize` finds them."""
    for fn in funcs:
        if not hasattr(fn, LAYER_NAME_ATTR):
            name = getattr(fn, "__name__", repr(fn))
            raise ValueError(
                f"Function `{name}` is not decorated with @use_kernel_forward_from_hub and "
                "cannot be used with @use_kernelized_func"
            )

    def decorator(cls: type[_T]) -> type[_T]:
        original_init = cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            attached = self.__dict__.setdefault(FUNCS_ATTR, {})
            for fn in funcs:
                key = getattr(fn, "__name__", None) or getattr(fn, LAYER_NAME_ATTR)
                attached[key] = fn

        __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return decorator
