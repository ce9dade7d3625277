"""`install_kernel`: make a kernel available on this host and return its variant folder, without
importing it (`kernels.install_kernel`).

Through kerneld the folder is the store's (the published index on a warm host, else the daemon,
which downloads it once for every job); the publisher trust and deny rules are those of a load.
When kerneld cannot provide it and the fallback policy is `hub`, the verified in-process Hub
download's folder is returned instead, as `kernels` would download it.
"""

from __future__ import annotations

from pathlib import Path

from kerneld_client import _config, _path_trust, locations
from kerneld_client._types import KernelRequest
from kerneld_client.errors import KernelDenied, KernelError, NoCompatibleVariant
from kerneld_client.loading.context import LoadContext, LoadOptions, parse_request
from kerneld_client.platform import current_platform

__all__ = ["install_kernel"]


def install_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
    local_files_only: bool = False,
    user_agent: str | dict[str, str] | None = None,
    trust_remote_code: bool | list[str] = False,
) -> Path:
    """The folder of the best build variant of the kernel for this process, fetched by the
    daemon if needed (`local_files_only`: only what the store already has). Raises the typed
    errors of kerneld_client."""
    request = parse_request(repo_id, version, revision)
    ctx = LoadContext(
        current_platform(backend),
        LoadOptions(allow_fetch=not local_files_only, trust_remote_code=trust_remote_code),
    ).entering(repo_id)
    try:
        return _store_folder(request, ctx)
    except KernelError as exc:
        final = isinstance(exc, KernelDenied | NoCompatibleVariant)
        if final or local_files_only or _config.fallback_policy() != "hub":
            raise
        from kerneld_client import _hub_download

        if not _hub_download.available():
            raise
        tree = _hub_download.fetch(
            repo_id,
            version=version,
            revision=revision,
            facts=ctx.facts,
            cache_root=locations.hub_cache_dir(),
            trust_remote_code=trust_remote_code,
            user_agent=user_agent,
        )
        _config.warn_once(
            repo_id,
            f"kerneld could not provide kernel {repo_id}@{request.ref} ({exc.message}); "
            "downloaded it directly from the Hub",
        )
        return tree.path


def _store_folder(request: KernelRequest, ctx: LoadContext) -> Path:
    from kerneld_client.loading.daemon import DaemonSource
    from kerneld_client.loading.published import PublishedIndexSource

    index = PublishedIndexSource()
    candidate = index.find(request, ctx)
    if candidate is None or candidate.stale:
        candidate = DaemonSource(index).find(request, ctx)
    if candidate.root is None:  # a local override: the caller's own folder
        return candidate.path
    # A store tree is named relative to the store root: the caller gets its checked real path.
    return _path_trust.check_tree(candidate.root, candidate.path)
