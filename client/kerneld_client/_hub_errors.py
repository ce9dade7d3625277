"""A repository or revision that does not exist, raised as `kernels` raises it when the start-up
hook serves the `kernels` package.

`kernels` asks the Hub, so a repo or a revision the Hub lacks is huggingface_hub's
`RepositoryNotFoundError` / `RevisionNotFoundError` (both `HfHubHTTPError`s), and code written
for `kernels` catches those. kerneld answers from its store and daemon; its `KernelNotFound` and
`RevisionNotFound` say the same thing. While the hook serves `kernels` (huggingface_hub is then
installed: `kernels` requires it), such an error is raised as an instance of both: kerneld's
type, which kerneld_client's own fallback rules read, and the Hub's, which the job's code reads.
kerneld's own API (not hooked) imports no huggingface_hub and raises kerneld's types only.
"""

from __future__ import annotations

from typing import Any

from kerneld_client import _config
from kerneld_client.errors import KernelError, KernelNotFound, RevisionNotFound, VersionNotFound

__all__ = ["as_kernels_raises"]

_BOTH: dict[tuple[type[KernelError], type[BaseException]], type[KernelError]] = {}


def _hub_type(exc: KernelError) -> type[BaseException] | None:
    """The huggingface_hub error `kernels` raises for what `exc` says; None where `kernels`
    raises something else (a version it lacks is a ValueError there too)."""
    if isinstance(exc, VersionNotFound):
        return None
    from huggingface_hub import errors as hub_errors

    if isinstance(exc, RevisionNotFound):
        return hub_errors.RevisionNotFoundError
    if type(exc) is KernelNotFound:
        return hub_errors.RepositoryNotFoundError
    return None


def as_kernels_raises(exc: KernelError) -> KernelError:
    """`exc`, also an instance of huggingface_hub's type for it when the hook serves `kernels`
    (otherwise `exc` unchanged)."""
    if not _config.hooked():
        return exc
    try:
        hub_type = _hub_type(exc)
    except ImportError:  # no huggingface_hub: nothing to be compatible with
        return exc
    if hub_type is None:
        return exc
    key = (type(exc), hub_type)
    both = _BOTH.get(key)
    if both is None:
        attrs: dict[str, Any] = {"__module__": type(exc).__module__, "__doc__": type(exc).__doc__}
        both = _BOTH[key] = type(type(exc).__name__, (type(exc), hub_type), attrs)
    raised = both.__new__(both)
    raised.__dict__.update(exc.__dict__)
    raised.args = exc.args
    # HfHubHTTPError's attributes: no HTTP response stands behind kerneld's answer.
    raised.__dict__.update({"response": None, "server_message": None, "request_id": None})
    return raised
