"""Kernel functions, kernelized per model instance.

A function marked with `use_kernel_forward_from_hub` is one module-level object that every model
calls by name, yet each model must be kernelizable on its own (two models on two devices, a copy
kernelized apart from its original). So each instance of a class decorated with
`use_kernelized_func` gets its own *wrapper* of each function it calls (an instance of the marked
function's class, in `_kernel_funcs`), which `kernelize` swaps like any layer; while the
instance's forward runs, a call to the shared function is routed to that instance's wrapper.

The routes live in a context variable, so threads and asyncio tasks running different models do
not see each other's, except while torch.compile traces: dynamo cannot trace a context variable,
so then the routes are a module-level value for as long as the outermost traced forward runs,
and the traced call is the chosen forward itself, so dynamo guards on which kernel runs, not on
which wrapper (one graph per implementation, however many layers share it). This is `kernels`
0.19's behaviour, and the wrappers copy, deep-copy and pickle as its do.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from contextvars import ContextVar, Token
from types import MethodType
from typing import TYPE_CHECKING, Any, TypeVar

from kerneld_client.layers._marks import FUNCS_ATTR, LAYER_NAME_ATTR

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "KERNEL_FUNCTION_ATTR",
    "forward_like",
    "kernel_function_class",
    "use_kernelized_func",
]

#: Class attribute of a marked function's class: the function itself. Its instances are the
#: shared object and the per-instance wrappers; neither has a forward of its own to restore.
KERNEL_FUNCTION_ATTR = "_kerneld_kernel_function"

_T = TypeVar("_T")
#: id(shared function) -> (the running instance's wrapper, the forward function it is bound to)
_Routes = dict[int, tuple[Any, Callable[..., Any]]]


def _compiling() -> bool:
    import torch

    # looked up on each call: torch.compiler.is_compiling is what dynamo (and tests) replace
    return bool(torch.compiler.is_compiling())


class _RouteTable:
    """Which wrapper serves each shared function for the forward running now."""

    def __init__(self) -> None:
        self._context: ContextVar[_Routes | None] = ContextVar(
            "kerneld_kernel_func_routes", default=None
        )
        self._traced: _Routes | None = None
        self._tracing = False

    def current(self) -> _Routes | None:
        if self._tracing or _compiling():
            return self._traced
        return self._context.get()

    def enter(self, routes: _Routes) -> Token[_Routes | None] | _Routes | None:
        """Make `routes` current; the result is what `leave` needs to restore the previous."""
        if self._tracing or _compiling():
            previous = self._traced
            self._traced, self._tracing = routes, True
            return previous
        return self._context.set(routes)

    def leave(self, token: Token[_Routes | None] | _Routes | None) -> None:
        if self._tracing:
            self._traced = token if isinstance(token, dict) else None
            self._tracing = self._traced is not None
        elif isinstance(token, Token):
            self._context.reset(token)


_ROUTES = _RouteTable()


def _new_wrapper(module_name: str, name: str) -> Any:
    """A fresh wrapper of the shared function `module_name.name` (unpickling, copying)."""
    shared = getattr(importlib.import_module(module_name), name)
    return type(shared)()


def forward_like(forward: Callable[..., Any], func: Callable[..., Any]) -> Callable[..., Any]:
    """`forward`, presented as `func`'s signature plus `self` (kernelize checks a replacing
    layer's forward against it)."""
    sig = inspect.signature(func)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[self_param, *sig.parameters.values()]
    )
    forward.__name__ = "forward"
    forward.__doc__ = func.__doc__
    return forward


def kernel_function_class(func: Callable[..., Any]) -> type[nn.Module]:
    """The `nn.Module` class of a marked function: its instances call `func` (or, while a model
    instance that owns one as its wrapper runs, that wrapper), and its forward has `func`'s
    signature plus `self`, so a hub layer replacing it is checked against `func`'s parameters."""
    from torch import nn

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        routes = _ROUTES.current()
        route = routes.get(id(self)) if routes is not None else None
        if route is not None:
            wrapper, chosen = route
            if not _compiling():
                return wrapper(*args, **kwargs)
            if chosen is not type(self).forward:
                # kernel layers are stateless: the shared object serves as `self`, so that
                # dynamo does not guard on each wrapper's identity
                return chosen(self, *args, **kwargs)
        return func(*args, **kwargs)

    def __reduce__(self: nn.Module) -> Any:
        if getattr(importlib.import_module(func.__module__), func.__name__, None) is self:
            return func.__name__  # the shared object: by reference, as pickle does a function
        state = dict(self.__dict__)
        bound = state.get("forward")
        chosen = None
        if isinstance(bound, MethodType) and bound.__self__ is self:
            chosen = state.pop("forward").__func__  # rebound to the copy in __setstate__
        return (_new_wrapper, (func.__module__, func.__name__), (state, chosen))

    def __setstate__(self: nn.Module, saved: tuple[dict[str, Any], Any]) -> None:
        state, chosen = saved
        self.__dict__.update(state)
        if chosen is not None:
            self.__dict__["forward"] = MethodType(chosen, self)

    namespace: dict[str, Any] = {
        "forward": forward_like(forward, func),
        "__reduce__": __reduce__,
        "__setstate__": __setstate__,
        KERNEL_FUNCTION_ATTR: staticmethod(func),
        "has_backward": getattr(func, "has_backward", True),
        "can_torch_compile": getattr(func, "can_torch_compile", False),
        "__module__": getattr(func, "__module__", __name__),
        "__doc__": func.__doc__,
    }
    return type(getattr(func, "__name__", "Func"), (nn.Module,), namespace)


def use_kernelized_func(*args: Any) -> Callable[[type[_T]], type[_T]]:
    """Give every instance of the decorated module class its own wrapper of each function
    (marked with `use_kernel_forward_from_hub`), which `kernelize` finds and swaps, and route
    the functions' calls made during the instance's forward to its wrappers. The parameter is
    `*args`, as `kernels` names it (its signature, introspected, is the same)."""
    keys: list[tuple[Any, str]] = []
    for fn in args:
        if not hasattr(fn, LAYER_NAME_ATTR):
            name = getattr(fn, "__name__", repr(fn))
            raise ValueError(
                f"Function `{name}` is not decorated with @use_kernel_forward_from_hub and "
                "cannot be used with @use_kernelized_func"
            )
        keys.append((fn, getattr(fn, "__name__", None) or getattr(fn, LAYER_NAME_ATTR)))

    def decorator(cls: type[_T]) -> type[_T]:
        original_init = cls.__init__
        original_forward = cls.forward  # type: ignore[attr-defined]

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            wrappers = self.__dict__.setdefault(FUNCS_ATTR, {})
            for fn, key in keys:
                wrappers[key] = type(fn)()

        @functools.wraps(original_forward)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            wrappers = self.__dict__.get(FUNCS_ATTR, {})
            routes = dict(_ROUTES.current() or {})
            for fn, key in keys:
                wrapper = wrappers.get(key)
                if wrapper is not None:
                    routes[id(fn)] = (wrapper, wrapper.forward.__func__)
            token = _ROUTES.enter(routes)
            try:
                return original_forward(self, *args, **kwargs)
            finally:
                _ROUTES.leave(token)

        __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        cls.forward = forward  # type: ignore[attr-defined]
        return cls

    return decorator
