"""Run code right after a module is imported, before its importer sees it: the import watcher
both start-up hooks use (`_autohook` for `kernels`, `diffusers` for Diffusers' attention
dispatch). Stdlib only and nothing at import time: it runs at every interpreter start with the
hook on.
"""

from __future__ import annotations

import sys

# Not `from typing import ...`: this runs at every start with the hook on; typing costs ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any


def warn(message: str) -> None:
    import warnings

    warnings.warn(message, RuntimeWarning, stacklevel=3)


class _Loader:
    """The real loader of the watched module, plus its finder's callback once the module ran."""

    def __init__(self, inner: Any, finder: AfterImport) -> None:
        self._inner = inner
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)  # a failed import keeps the finder for a retry
        self._finder.remove()
        self._finder.then()

    def __getattr__(self, name: str) -> Any:
        # get_resource_reader, get_source, is_package...: the real loader's
        return getattr(self._inner, name)


class AfterImport:
    """A meta-path finder that only ever answers for `target`, with a loader that calls `then()`
    right after the module has run (before the importer sees it), then leaves the import path."""

    target = ""

    def then(self) -> None:
        """Called once `target` is imported (the subclass's hook)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.target:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader, self)  # type: ignore[assignment]
            return spec
        except Exception as exc:
            warn(f"kerneld: could not wrap `import {self.target}` ({exc!r})")
            self.remove()
            return None

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def insert(self) -> None:
        """Watch for `target` (once: a second finder of the same class is not added)."""
        if not any(type(f) is type(self) for f in sys.meta_path):
            sys.meta_path.insert(0, self)
