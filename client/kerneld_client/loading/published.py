"""The warm path's source: the daemon's published index, read without any RPC.

One small JSON document per repo says which commit a ref names, what is denied, which
variants of each commit are in the store (and which exist upstream), and which one each
platform the daemon has seen loads (`picks`, by platform fingerprint). A candidate comes back
only when the best variant for this platform is present; when the upstream has a better one
not cached yet, or the publisher is not trusted as published, or the document is unreadable,
the answer is None and the daemon decides.

The best variant is the published pick for this process's fingerprint. Only a platform the
daemon has not seen yet (or a commit no variant fits, for the reasons) ranks the variants
here, importing the variant rules to do so.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from kerneld_client import _config, _path_trust, published_index
from kerneld_client._loads import VERSIONS_SEEN
from kerneld_client._types import KernelRequest
from kerneld_client.errors import (
    KernelDenied,
    KernelUnavailable,
    NoCompatibleVariant,
    UntrustedPath,
    VariantReason,
    group_hint,
)
from kerneld_client.loading.context import LoadContext
from kerneld_client.loading.loaded import provenance_seen, store_root
from kerneld_client.loading.sources import Candidate

#: repo -> every `vN` upstream, as the last index document read for it said (shared with the
#: warm fast path).
_versions_seen = VERSIONS_SEEN


def read_commit(
    root: _path_trust.StoreRoot, request: KernelRequest
) -> tuple[str, published_index.CommitEntry | None, float | None] | None:
    """(commit, its entry, seconds since the daemon resolved the ref) for the request's ref
    in the published index, or None when the index has no answer (ask the daemon). The entry
    is None when the commit has nothing in the store; the age is None for a commit asked for
    by itself. Raises KernelDenied for a denied ref or commit (final),
    KernelUnavailable when the store is closed to this user, UntrustedPath otherwise."""
    try:
        doc = published_index.read_repo_index(
            root.real_path, request.repo_id, owner_uid=root.owner_uid
        )
    except PermissionError as exc:
        if exc.errno == errno.EACCES:  # the store is not readable by this user: not untrusted
            raise KernelUnavailable(
                f"no permission to read the host's kernel store ({exc.filename})",
                repo_id=request.repo_id,
                hint=group_hint(_store_gid(root.real_path)),
            ) from exc
        raise UntrustedPath(f"published index: {exc}", repo_id=request.repo_id) from exc
    except published_index.IndexFormatError:
        return None  # the daemon will know
    if doc is None:
        return None
    _versions_seen[request.repo_id] = doc.versions
    commit = doc.commit_for(request.ref)
    reason = doc.deny_reason(request.ref, commit)
    if reason is not None:
        raise KernelDenied(reason, repo_id=request.repo_id, revision=request.ref)
    if commit is None:
        return None
    resolved_at = doc.refs.get(request.ref)
    age_s = None if resolved_at is None else time.time() - resolved_at[1]
    return commit, doc.commits.get(commit), age_s


def _store_gid(path: Path) -> int | None:
    try:
        return os.stat(path).st_gid
    except OSError:
        return None


def _publisher_trusted(root: _path_trust.StoreRoot, repo_id: str, ctx: LoadContext) -> bool:
    """The daemon's `[trust]` verdict as published; anything unreadable is a question for it.
    A store without the file was never served by a daemon that checks publishers (kerneld
    writes it whenever it opens the store): its index is trusted as it was before the check."""
    try:
        publishers = published_index.read_publishers(root.real_path, owner_uid=root.owner_uid)
    except (OSError, published_index.IndexFormatError):
        return False
    return publishers is None or publishers.trusts(
        repo_id, trust_remote_code=ctx.options.trusts(repo_id)
    )


_UNSEEN = "\0"  # not a variant name: the daemon published no pick for this platform


def _rank(
    request: KernelRequest, commit: str, entry: published_index.CommitEntry, ctx: LoadContext
) -> str | None:
    """What the daemon's pick would be: the best variant upstream when the upstream's list is
    known (NoCompatibleVariant, with every reason, when none fits), else the best in store."""
    from kerneld_client.variants import decide

    facts = ctx.facts
    if entry.upstream_variants is None:
        present = decide(entry.variants, facts)
        return present[0].variant if present and present[0].accepted else None
    upstream = decide(entry.upstream_variants, facts)
    if not any(d.accepted for d in upstream):
        raise NoCompatibleVariant(
            f"no build variant fits this platform ({facts.describe()})",
            reasons=[VariantReason(d.variant, d.accepted, d.reason) for d in upstream],
            repo_id=request.repo_id,
            revision=commit,
        )
    return upstream[0].variant


class PublishedIndexSource:
    """The store's published index. `root` is read once per load (None: no store here)."""

    def __init__(self) -> None:
        self.root = store_root()

    def refresh(self) -> None:
        """Read the store root again (the daemon may have just created the store)."""
        self.root = self.root or store_root()

    def find(self, request: KernelRequest, ctx: LoadContext) -> Candidate | None:
        """The tree to load, or None (ask the daemon). Raises KernelDenied, and
        NoCompatibleVariant when the commit's full variant list is known and none fits:
        both are final for an immutable commit."""
        root = self.root
        if root is None:
            return None
        found = read_commit(root, request)
        if found is None or not _publisher_trusted(root, request.repo_id, ctx):
            return None  # the daemon decides, and says why if it refuses
        commit, entry, age_s = found
        if entry is None:
            return None
        best = entry.picks.get(ctx.platform.key, _UNSEEN)
        if best is None or best is _UNSEEN:  # ranked here: a new platform, or for the reasons
            best = _rank(request, commit, entry, ctx)
        variant = entry.variants.get(best) if best is not None else None
        if variant is None:
            return None  # not in the store (yet): the daemon fetches it
        provenance_seen[variant.digest] = variant.provenance
        max_age = _config.ref_max_age_s()
        return Candidate(
            request=request,
            source="index",
            path=Path(variant.tree),
            variant=variant.name,
            commit=commit,
            digest=variant.digest,
            root=root,
            lock=root.real_path / variant.lock,
            stale=max_age is not None and age_s is not None and age_s > max_age,
        )


def note_newer_version(request: KernelRequest, logger_name: str) -> None:
    """`kernels`' notice when a load by version is not the repo's newest version, on every
    such load as in `kernels`. The versions are the daemon's last upstream listing, from the
    index this load read (or read now, after an RPC)."""
    if request.version is None:
        return
    repo_id = request.repo_id
    versions = _versions_seen[repo_id] if repo_id in _versions_seen else upstream_versions(repo_id)
    if versions and max(versions) > request.version:
        import logging

        logging.getLogger(logger_name).warning(
            "You are using version %d of '%s', but version %d is available.",
            request.version,
            repo_id,
            max(versions),
        )


def forget_versions(repo_id: str) -> None:
    """The daemon may publish the repo's version list as it answers: read it again after."""
    _versions_seen.pop(repo_id, None)


def upstream_versions(repo_id: str) -> tuple[int, ...] | None:
    """Every `vN` the daemon saw upstream when it last resolved a version of `repo_id`, from
    the published index; None when it never listed them or there is no readable store."""
    root = store_root()
    if root is None:
        return None
    try:
        doc = published_index.read_repo_index(root.real_path, repo_id, owner_uid=root.owner_uid)
    except (OSError, published_index.IndexFormatError):
        return None
    return None if doc is None else doc.versions
