"""A repository or revision that does not exist, raised as `kernels` raises it.

`kernels` asks the Hub, so a repo or a revision the Hub lacks is huggingface_hub's
`RepositoryNotFoundError` / `RevisionNotFoundError` (both `HfHubHTTPError`s), and code written
for `kernels` catches those. kerneld answers from its store and daemon; its `KernelNotFound` and
`RevisionNotFound` say the same thing. Wherever huggingface_hub is installed, on every route
(kerneld's own API, the hook serving `kernels`, the Hub fallback), such an error is raised as an
instance of both: kerneld's type (a `FileNotFoundError`), which kerneld_client's own fallback
rules read, and the Hub's, which code ported from `kernels` reads (issue 53).

huggingface_hub is imported only here, only on that error path, and only when installed: a
process that loads kernels never pays for it: `import huggingface_hub.errors` costs about 90 ms
(it brings its HTTP client; measured with `python -X importtime` on a loaded 2-core machine),
the check that it is installed (`importlib.util.find_spec`) about 0.1 ms.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from kerneld_client.errors import KernelError, KernelNotFound, RevisionNotFound, VersionNotFound

__all__ = ["as_kernels_raises"]

_BOTH: dict[tuple[type[KernelError], type[BaseException]], type[KernelError]] = {}


def _hub_errors() -> ModuleType | None:
    """huggingface_hub.errors, imported now if need be; None where it is not installed."""
    module = sys.modules.get("huggingface_hub.errors")
    if module is not None:
        return module
    try:
        if importlib.util.find_spec("huggingface_hub") is None:
            return None
        from huggingface_hub import errors
    except (ImportError, ValueError):  # not installed, or broken: nothing to be compatible with
        return None
    return errors


def _hub_type(exc: KernelError) -> type[BaseException] | None:
    """The huggingface_hub error `kernels` raises for what `exc` says; None where `kernels`
    raises something else (a version it lacks is a ValueError there too)."""
    if isinstance(exc, VersionNotFound) or not isinstance(exc, KernelNotFound):
        return None
    if not isinstance(exc, RevisionNotFound) and type(exc) is not KernelNotFound:
        return None
    hub_errors = _hub_errors()
    if hub_errors is None:
        return None
    if isinstance(exc, RevisionNotFound):
        return hub_errors.RevisionNotFoundError  # type: ignore[no-any-return]
    return hub_errors.RepositoryNotFoundError  # type: ignore[no-any-return]


def _rebuild(kind: type[KernelError], args: tuple[Any, ...], state: dict[str, Any]) -> KernelError:
    """Unpickle a combined error: kerneld's type again, combined again where it can be."""
    exc = kind.__new__(kind)
    exc.args = args
    exc.__dict__.update(state)
    return as_kernels_raises(exc)


def _reduce_ex(self: KernelError, protocol: int) -> tuple[Any, ...]:
    """Pickle a combined error as kerneld's type (the combined class is made at run time, so
    pickle cannot name it; huggingface_hub's own `__reduce_ex__` would name it): an error
    raised in a worker process reaches its parent."""
    del protocol
    kerneld_type = next(t for t in type(self).__mro__[1:] if issubclass(t, KernelError))
    return (_rebuild, (kerneld_type, self.args, dict(self.__dict__)))


def as_kernels_raises(exc: KernelError) -> KernelError:
    """`exc`, also an instance of huggingface_hub's type for it where huggingface_hub is
    installed (otherwise `exc` unchanged)."""
    hub_type = _hub_type(exc)
    if hub_type is None or isinstance(exc, hub_type):
        return exc
    key = (type(exc), hub_type)
    both = _BOTH.get(key)
    if both is None:
        attrs: dict[str, Any] = {
            "__module__": type(exc).__module__,
            "__doc__": type(exc).__doc__,
            "__reduce_ex__": _reduce_ex,
        }
        both = _BOTH[key] = type(type(exc).__name__, (type(exc), hub_type), attrs)
    raised = both.__new__(both)
    raised.__dict__.update(exc.__dict__)
    raised.args = exc.args
    # HfHubHTTPError's attributes: no HTTP response stands behind kerneld's answer.
    raised.__dict__.update({"response": None, "server_message": None, "request_id": None})
    return raised
