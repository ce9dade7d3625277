"""What a load is asked for: the checked selector, the caller's options, the dependency chain.

One frozen `LoadContext` travels through every stage instead of the platform, the options
and the dependency stack being passed one by one; a dependency is loaded under
`ctx.entering(repo)`, which is where a `kernel-depends` cycle is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kerneld_client._loads import MISSING
from kerneld_client._types import KernelRequest
from kerneld_client.errors import KernelError, KernelLoadError
from kerneld_client.platform import Platform
from kerneld_client.vocabulary import is_repo_id

if TYPE_CHECKING:
    from kerneld_client.variants import PlatformFacts


__all__ = [
    "MISSING",
    "LoadContext",
    "LoadOptions",
    "as_kernel_error",
    "check_python_depends",
    "parse_request",
]


def parse_request(
    repo_id: str, version: int | None, revision: str | None, *, required: bool = True
) -> KernelRequest:
    """Validate the selector as `kernels` does: exactly one of version and revision."""
    if not is_repo_id(repo_id):
        raise ValueError(f"repo_id must look like 'org/name', got {repo_id!r}")
    if version is not None and revision is not None:
        raise ValueError("Only one of `revision` or `version` must be specified.")
    if required and version is None and revision is None:
        raise ValueError(
            "A kernel version or revision must be specified: `version=<major>` (branch vN) or "
            "`revision=<branch, tag or commit>`."
        )
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise ValueError(f"version must be an integer, got {version!r}")
    if version is not None and version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return KernelRequest(repo_id, version=version, revision=revision)


def check_python_depends(folder: Path, variant: str) -> None:
    """The default `before_import`: the build's `python-depends` are installed."""
    from kerneld_client.loading.python_deps import check_python_depends

    check_python_depends(folder, variant)


class LoadOptions:
    """The caller's choices that change what a load may do (part of the memo key, except
    `before_import`, which only the `kernels` hook sets)."""

    __slots__ = ("allow_fetch", "before_import", "check_arch", "locks", "trust")

    def __init__(
        self,
        *,
        check_arch: bool = True,
        allow_fetch: bool = True,
        locks: Mapping[str, str] | None = None,
        trust_remote_code: bool | Sequence[str] = False,
        before_import: Callable[[Path, str], None] | None = None,
    ) -> None:
        self.check_arch = check_arch
        self.allow_fetch = allow_fetch
        # (folder, variant) -> None, or raises: a check of a verified tree before its code runs
        # (default: the build's `python-depends` are installed)
        self.before_import = before_import or check_python_depends
        # repo -> locked commit, from a lock file (applies to dependencies too)
        self.locks: Mapping[str, str] = locks or {}
        # `kernels`' trust_remote_code: True, or the repos whose publisher the caller trusts
        trust = trust_remote_code
        self.trust: bool | frozenset[str] = trust if isinstance(trust, bool) else frozenset(trust)

    def trusts(self, repo_id: str) -> bool:
        """Did the caller accept `repo_id`'s code whoever published it?"""
        return self.trust is True or (not isinstance(self.trust, bool) and repo_id in self.trust)

    def memo_key(self) -> tuple[object, ...]:
        return (self.check_arch, self.allow_fetch, tuple(sorted(self.locks.items())), self.trust)


class LoadContext:
    """The platform, options and the chain of kernels being loaded (for cycle errors)."""

    __slots__ = ("options", "platform", "stack")

    def __init__(
        self, platform: Platform, options: LoadOptions, stack: tuple[str, ...] = ()
    ) -> None:
        self.platform = platform
        self.options = options
        self.stack = stack

    @property
    def facts(self) -> PlatformFacts:
        """The facts the variant rules take (imports the rules: not on the warm path)."""
        return self.platform.facts

    def entering(self, repo_id: str) -> LoadContext:
        """The context for loading `repo_id` from here; KernelLoadError on a cycle."""
        if repo_id in self.stack:
            raise KernelLoadError(
                "kernel-depends cycle: " + " -> ".join((*self.stack, repo_id)), repo_id=repo_id
            )
        return LoadContext(self.platform, self.options, (*self.stack, repo_id))

    def dependency_request(
        self, repo_id: str, version: int | None, revision: str | None
    ) -> KernelRequest:
        """A `kernel-depends` entry as a request; a lock file's pin for the repo wins."""
        locked = self.options.locks.get(repo_id)
        if locked is not None:
            return KernelRequest(repo_id, locked_commit=locked)
        return KernelRequest(repo_id, version=version, revision=revision)


def as_kernel_error(exc: BaseException, request: KernelRequest) -> KernelError:
    """Any failure of a load as the typed error callers see (the cause kept)."""
    if isinstance(exc, KernelError):
        return exc
    wrapped = KernelLoadError(
        f"unexpected failure: {exc!r}", repo_id=request.repo_id, revision=request.ref
    )
    wrapped.__cause__ = exc
    return wrapped
