"""Load kernels: the public API, with the names and meaning of the `kernels` package.

`get_kernel`, `has_kernel`, `get_local_kernel`, `load_kernel`, `get_locked_kernel`,
`get_kernel_variants` and `get_loaded_kernels` behave as their `kernels` namesakes, so code
written for it works unchanged; kernels come from the host's kerneld store instead of a
per-process download. How a load proceeds is in `kerneld_client.loading`, one stage per module:
the sources (local override, the published index on the warm path, the daemon, the Hub as a
fallback), `materialize` (lock, trust, verify, device check, dependencies, import), and the
fallback policy: the caller's `fallback=` object (or the typed error), a verified in-process
Hub download (`hub`), or the error (`error`, or `KERNELD_REQUIRE=1`). `get_kernel` itself is
the warm fast path's (`_warm`), which serves a warm hit without these stages and hands every
other load to `staged_get_kernel`.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kerneld_client import _config
from kerneld_client._types import KernelRequest
from kerneld_client._warm import get_kernel
from kerneld_client.errors import KernelError, KernelLoadError
from kerneld_client.loading.call import failed_import as _failed_import
from kerneld_client.loading.call import run
from kerneld_client.loading.context import MISSING, LoadContext, LoadOptions, parse_request
from kerneld_client.loading.loaded import LoadedKernel, loaded_kernels
from kerneld_client.loading.published import note_newer_version
from kerneld_client.platform import current_platform, platform_facts

if TYPE_CHECKING:
    from kerneld_client.loading.fallback import FallbackPolicy
    from kerneld_client.variants import Decision

__all__ = [
    "LoadedKernel",
    "get_kernel",
    "get_kernel_variants",
    "get_loaded_kernels",
    "get_local_kernel",
    "get_locked_kernel",
    "has_kernel",
    "load_kernel",
    "loaded_kernels",
    "staged_get_kernel",
]


def get_loaded_kernels() -> list[LoadedKernel]:
    """`kernels`' name for `loaded_kernels()`: one entry per variant folder loaded."""
    return loaded_kernels()


def staged_get_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
    fallback: object = MISSING,
    policy: str | FallbackPolicy | None = None,
    check_arch: bool = True,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> Any:
    """`get_kernel` through the staged loader: what the warm fast path (`_warm.get_kernel`,
    tried first) hands over when a load is not a warm hit it serves."""
    req = parse_request(repo_id, version, revision)
    module = run(
        req,
        backend=backend,
        options=LoadOptions(check_arch=check_arch, trust_remote_code=trust_remote_code),
        fallback=fallback,
        policy=policy,
        hub_allowed=True,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )
    if version is not None and module is not fallback:
        note_newer_version(req, _config.kernels_logger("versions", "kerneld_client"))
    return module


def failed_import(
    message: str,
    cause: BaseException | None,
    repo_id: str,
    *,
    revision: str | None,
    version: int | None,
    backend: str | None,
    fallback: object,
    policy: str | FallbackPolicy | None,
    check_arch: bool,
    trust_remote_code: bool | list[str],
    user_agent: str | dict[str, str] | None,
) -> Any:
    """The warm fast path's import of a checked tree failed in the kernel's own code: the
    staged loader's KernelLoadError, under the caller's fallback policy."""
    req = parse_request(repo_id, version, revision)
    error = KernelLoadError(message)
    error.__cause__ = cause
    module = _failed_import(
        error,
        req,
        backend=backend,
        options=LoadOptions(check_arch=check_arch, trust_remote_code=trust_remote_code),
        fallback=fallback,
        policy=policy,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )
    if version is not None and module is not fallback:  # a `hub` fallback's kernel
        note_newer_version(req, _config.kernels_logger("versions", "kerneld_client"))
    return module


def has_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
    check_arch: bool = True,
    trust_remote_code: bool | list[str] = False,
) -> bool:
    """Whether a build of the kernel fits this process (nothing is imported or downloaded)."""
    del trust_remote_code  # accepted for compatibility; the daemon applies the host's policy
    req = parse_request(repo_id, version, revision)
    facts = platform_facts(backend)
    from kerneld_client.loading.listing import has_variant
    from kerneld_client.loading.local import local_overrides

    if req.repo_id in local_overrides():
        return True

    try:
        return has_variant(req, facts, check_arch=check_arch)
    except KernelError:
        return False


def get_kernel_variants(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
) -> list[Decision]:
    """Every build variant of the revision with its verdict for this process, accepted ones
    first (best first), then the rejected ones with their reasons. Raises typed errors."""
    from kerneld_client.loading.listing import variants

    req = parse_request(repo_id, version, revision)
    return variants(req, platform_facts(backend))[0]


def get_local_kernel(
    repo_path: str | os.PathLike[str],
    *,
    backend: str | None = None,
    check_arch: bool = True,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> ModuleType:
    """Import a kernel from a local repository (`build/<variant>/`) or variant folder.

    The folder is the caller's own, so the store's trust checks do not apply; the import still
    never writes bytecode into it.
    """
    del trust_remote_code, user_agent  # accepted for compatibility with `kernels`
    from kerneld_client.loading.local import folder_candidate
    from kerneld_client.loading.pipeline import load_candidate

    path = Path(repo_path)
    platform = current_platform(backend)
    ctx = LoadContext(platform, LoadOptions(check_arch=check_arch)).entering(str(path))
    return load_candidate(folder_candidate(path, ctx.facts, repo_id=str(path)), ctx).module


def load_kernel(
    repo_id: str,
    *,
    lockfile: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    fallback: object = MISSING,
    policy: str | FallbackPolicy | None = None,
    check_arch: bool = True,
) -> Any:
    """Load the commit `kernels.lock` pins (either format) from the store; never downloads.

    Without `lockfile`, the lock file of the caller's installed package is used, as in
    `kernels`. The `hub` policy does not apply (that would be a download).
    """
    from kerneld_client.loading.locked import locked_commits

    locks = locked_commits(repo_id, lockfile)
    req = KernelRequest(repo_id, locked_commit=locks[repo_id])
    return run(
        req,
        backend=backend,
        options=LoadOptions(check_arch=check_arch, allow_fetch=False, locks=locks),
        fallback=fallback,
        policy=policy,
        hub_allowed=False,
    )


def get_locked_kernel(
    repo_id: str,
    *,
    lockfile: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    fallback: object = MISSING,
    policy: str | FallbackPolicy | None = None,
    check_arch: bool = True,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> Any:
    """Load the commit `kernels.lock` pins, letting the daemon download it if needed."""
    from kerneld_client.loading.locked import locked_commits

    locks = locked_commits(repo_id, lockfile)
    req = KernelRequest(repo_id, locked_commit=locks[repo_id])
    return run(
        req,
        backend=backend,
        options=LoadOptions(
            check_arch=check_arch,
            allow_fetch=True,
            locks=locks,
            trust_remote_code=trust_remote_code,
        ),
        fallback=fallback,
        policy=policy,
        hub_allowed=True,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )
