"""Function repositories: `kernels`' deprecated way to map a *function* of a kernel.

`FuncRepository`, `LocalFuncRepository`, `LockedFuncRepository` and `use_kernel_func_from_hub`
exist so code written for `kernels` <= 0.16 runs unchanged; `kernels` 0.17 keeps them deprecated
and so do we (one logged warning at construction, as `kernels` logs it). They differ from the layer
repositories in one point only: the replacement is the kernel's top-level function `func_name` (not
`layers.<name>`), wrapped into an `nn.Module` whose forward has the function's signature, as
`use_kernel_forward_from_hub` does for a marked function. Loading, caching, trust and fallback are
the layer repositories' own. New code maps a function kernel with a `LayerRepository` whose layer
is the kernel's function-shaped layer class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneld_client.errors import KernelLoadError
from kerneld_client.layers._decorators import use_kernel_forward_from_hub
from kerneld_client.layers._kernel_funcs import forward_like
from kerneld_client.layers._repos import (
    KernelSource,
    LayerRepository,
    LocalLayerRepository,
    LockedLayerRepository,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "FuncRepository",
    "LocalFuncRepository",
    "LockedFuncRepository",
    "use_kernel_func_from_hub",
]


def _deprecated(name: str, instead: str) -> None:
    logging.getLogger("kerneld_client.layers").warning(
        "%s is deprecated, as in kernels 0.17, and will be removed; use %s instead",
        name,
        instead,
    )


def function_layer_class(func: Callable[..., Any]) -> type[nn.Module]:
    """A kernel layer class whose forward calls the kernel function `func`, with `func`'s
    signature (plus `self`), so it is checked against the function it replaces."""
    from torch import nn

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    namespace: dict[str, Any] = {
        "forward": forward_like(forward, func),
        "has_backward": getattr(func, "has_backward", True),
        "can_torch_compile": getattr(func, "can_torch_compile", False),
        "__module__": getattr(func, "__module__", __name__),
        "__doc__": func.__doc__,
    }
    return type(getattr(func, "__name__", "Func"), (nn.Module,), namespace)


def function_layer(source: KernelSource, func_name: str, where: str) -> type[nn.Module]:
    """The kernel's top-level function `func_name` as an `nn.Module` class."""
    func = getattr(source.module, func_name, None)
    if not callable(func):
        raise KernelLoadError(
            f"function `{func_name}` not found in kernel {where}", repo_id=source.repo
        )
    return function_layer_class(func)


class _KernelFunction:
    """What the three function repositories add to their layer repository: the layer is the
    kernel's function `func_name`, and a function repository never equals a layer one."""

    func_name: str

    def layer_class(self, source: KernelSource) -> type[nn.Module]:
        return function_layer(source, self.func_name, str(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self)) and super().__eq__(other)

    def __hash__(self) -> int:
        return hash(("func", super().__hash__()))


class FuncRepository(_KernelFunction, LayerRepository):
    """A function of a Hub kernel repo at a version (branch `vN`) or a revision."""

    def __init__(
        self,
        repo_id: str,
        *,
        func_name: str,
        revision: str | None = None,
        version: int | None = None,
        trust_remote_code: bool | list[str] = False,
        check_arch: bool = True,
    ) -> None:
        _deprecated("FuncRepository", "LayerRepository")
        super().__init__(
            repo_id,
            layer_name=func_name,
            revision=revision,
            version=version,
            trust_remote_code=trust_remote_code,
            check_arch=check_arch,
        )
        self.func_name = func_name

    def __str__(self) -> str:
        return f"`{self.repo_id}` ({self.ref}), function `{self.func_name}`"

    def __repr__(self) -> str:
        selector = (
            f"version={self.version}" if self.version is not None else f"revision={self.revision!r}"
        )
        return f"FuncRepository({self.repo_id!r}, func_name={self.func_name!r}, {selector})"


class LocalFuncRepository(_KernelFunction, LocalLayerRepository):
    """A function of a kernel on local disk."""

    def __init__(self, repo_path: str | Path, *, func_name: str, check_arch: bool = True) -> None:
        _deprecated("LocalFuncRepository", "LocalLayerRepository")
        super().__init__(repo_path, layer_name=func_name, check_arch=check_arch)
        self.func_name = func_name

    def __str__(self) -> str:
        return f"`{self.repo_path}` (function `{self.func_name}`)"

    def __repr__(self) -> str:
        return f"LocalFuncRepository({str(self.repo_path)!r}, func_name={self.func_name!r})"


class LockedFuncRepository(_KernelFunction, LockedLayerRepository):
    """A function of a kernel at the commit a `kernels.lock` pins."""

    def __init__(
        self,
        repo_id: str,
        *,
        lockfile: str | Path | None = None,
        func_name: str,
        trust_remote_code: bool | list[str] = False,
        check_arch: bool = True,
    ) -> None:
        _deprecated("LockedFuncRepository", "LockedLayerRepository")
        super().__init__(
            repo_id,
            lockfile=lockfile,
            layer_name=func_name,
            trust_remote_code=trust_remote_code,
            check_arch=check_arch,
        )
        self.func_name = func_name

    def __str__(self) -> str:
        return f"`{self.repo_id}` (locked), function `{self.func_name}`"

    def __repr__(self) -> str:
        where = f"lockfile={str(self.lockfile)!r}" if self.lockfile else f"caller={self._caller!r}"
        return f"LockedFuncRepository({self.repo_id!r}, func_name={self.func_name!r}, {where})"


def use_kernel_func_from_hub(func_name: str) -> Callable[[Callable[..., Any]], Any]:
    """Deprecated spelling of `use_kernel_forward_from_hub` on a function."""
    _deprecated("use_kernel_func_from_hub", "use_kernel_forward_from_hub")
    return use_kernel_forward_from_hub(func_name)
