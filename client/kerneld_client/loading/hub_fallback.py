"""The `hub` fallback's source: a verified download into this user's own cache.

Used only by the fallback policy, after kerneld could not provide the kernel. The host's deny
list still applies (before the download, and to the commit it turned out to be; repo ids
compared case-insensitively, as the Hub resolves them), and the cache must belong to this
user: its trees are then trusted like the store's (`Candidate.root`).
"""

from __future__ import annotations

import os

from kerneld_client import _config, _path_trust, locations, published_index
from kerneld_client._types import KernelRequest
from kerneld_client.errors import KernelDenied, UntrustedPath
from kerneld_client.loading.context import LoadContext
from kerneld_client.loading.loaded import store_root
from kerneld_client.loading.sources import Candidate
from kerneld_client.vocabulary import is_commit, repo_key


class HubSource:
    """Download from the Hub with `huggingface_hub`, as `kernels` would, into
    `KERNELD_HUB_CACHE`; `trust_remote_code` and `user_agent` go to the download."""

    def __init__(
        self, *, trust_remote_code: bool | list[str], user_agent: str | dict[str, str] | None
    ) -> None:
        self.trust_remote_code = trust_remote_code
        self.user_agent = user_agent

    def find(self, request: KernelRequest, ctx: LoadContext) -> Candidate:
        from kerneld_client import _hub_download

        denies = _host_denies()

        key = repo_key(request.repo_id)

        def check_denied(commit: str | None) -> None:
            for repo, revision, reason in denies:
                if repo_key(repo) == key and published_index.deny_covers(
                    revision, request.ref, commit
                ):
                    raise KernelDenied(reason or "denied on this host", repo_id=request.repo_id)

        check_denied(request.ref if is_commit(request.ref) else None)
        cache = locations.hub_cache_dir()
        tree = _hub_download.fetch(
            request.repo_id,
            version=request.version,
            revision=request.locked_commit or request.revision,
            facts=ctx.facts,
            cache_root=cache,
            trust_remote_code=self.trust_remote_code,
            user_agent=self.user_agent,
        )
        check_denied(tree.commit)
        cache_root = _path_trust.store_root(cache)
        if cache_root.owner_uid != os.geteuid():
            raise UntrustedPath(f"the hub cache {cache} belongs to uid {cache_root.owner_uid}")
        return Candidate(
            request=request,
            source="hub",
            path=tree.path,
            variant=tree.variant,
            commit=tree.commit,
            root=cache_root,
        )


def _host_denies() -> list[tuple[str, str, str]]:
    """The store's published deny list; empty without a readable store."""
    try:
        root = store_root()
    except UntrustedPath as exc:
        # An untrusted store's deny list is no more trustworthy than its trees; refusing the
        # fallback on its account would let whoever planted it block every job.
        _config.log.warning("hub fallback without the host's deny list: %s", exc)
        return []
    if root is None:
        return []
    try:
        return published_index.read_denies(root.real_path, owner_uid=root.owner_uid)
    except (PermissionError, published_index.IndexFormatError):
        return []
