"""Swapping one layer instance's `forward`, and putting it back: what makes `kernelize` reversible.

`kernelize` never touches a class: it binds the kernel layer's `forward` in the instance's
`__dict__`, after recording what that `__dict__` said about `forward` before the first swap.
`unkernelize(model)` (or a fallback in a later `kernelize`) restores exactly that. The last
report of each model is kept here too, because `unkernelize` forgets it with the swaps.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from types import MethodType
from typing import TYPE_CHECKING, Any

from kerneld_client.layers._kernel_funcs import KERNEL_FUNCTION_ATTR
from kerneld_client.layers._marks import FUNCS_ATTR, LAYER_NAME_ATTR
from kerneld_client.layers._report import KernelizeReport

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "REPO_ATTR",
    "SAVED_ATTR",
    "install_forward",
    "kernelize_report",
    "marked",
    "remember_report",
    "restore_forward",
    "unkernelize",
]


@dataclass(frozen=True)
class _Saved:
    """What an instance's `__dict__` said about `forward` before the first kernelize."""

    had_forward: bool
    forward: Any


#: Instance attribute (in `__dict__`) holding the `_Saved` state; it travels with
#: `copy.deepcopy`, so a copy of a kernelized model can be unkernelized too.
SAVED_ATTR = "_kerneld_saved_forward"
#: Instance attribute (in `__dict__`) holding the repository whose kernel the forward is now
#: (`get_kernelized_layers` reads it), while it is.
REPO_ATTR = "_kerneld_kernel_repo"

_reports: weakref.WeakKeyDictionary[Any, KernelizeReport] = weakref.WeakKeyDictionary()
_state_lock = threading.Lock()


def install_forward(module: nn.Module, layer: type[nn.Module], repo: Any = None) -> None:
    """Bind `layer.forward` as `module`'s own forward, saving the original on the first swap;
    `repo` is the repository it came from."""
    state = module.__dict__
    if SAVED_ATTR not in state:
        state[SAVED_ATTR] = _Saved("forward" in state, state.get("forward"))
    state["forward"] = MethodType(layer.forward, module)
    state[REPO_ATTR] = repo


def restore_forward(module: nn.Module, *, forget: bool = False) -> None:
    """Put back the forward saved by `install_forward` (nothing if it never ran); `forget`
    also drops the saved state, as if `module` had never been kernelized."""
    state = module.__dict__
    saved = state.get(SAVED_ATTR)
    if hasattr(type(module), KERNEL_FUNCTION_ATTR):
        # a kernel function's wrapper has no forward of its own: whoever bound one (kernelize,
        # or code that swaps kernels by hand), falling back means the function again
        state.pop("forward", None)
        state.pop(REPO_ATTR, None)
        if forget:
            state.pop(SAVED_ATTR, None)
        return
    if not isinstance(saved, _Saved):
        return
    state.pop(REPO_ATTR, None)
    if saved.had_forward:
        state["forward"] = saved.forward
    else:
        state.pop("forward", None)
    if forget:
        del state[SAVED_ATTR]


def marked(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """(name, module) for every marked module and attached function, each once."""
    seen: set[int] = set()
    for name, module in model.named_modules():
        for key, func in dict(module.__dict__.get(FUNCS_ATTR, {})).items():
            if id(func) not in seen:
                seen.add(id(func))
                yield (f"{name}.{key}" if name else key), func
        if hasattr(type(module), LAYER_NAME_ATTR) and id(module) not in seen:
            seen.add(id(module))
            yield (name or "<model>"), module


def remember_report(model: nn.Module, report: KernelizeReport) -> None:
    """Keep `report` as the last one of `model` (for as long as `model` lives)."""
    with _state_lock:
        _reports[model] = report


def unkernelize(model: nn.Module) -> nn.Module:
    """Put every layer instance `kernelize` touched back to its own forward."""
    for _name, module in marked(model):
        restore_forward(module, forget=True)
    with _state_lock:
        _reports.pop(model, None)
    return model


def kernelize_report(model: nn.Module) -> KernelizeReport | None:
    """The report of the last `kernelize` of `model` (None if never, or after `unkernelize`)."""
    with _state_lock:
        return _reports.get(model)
