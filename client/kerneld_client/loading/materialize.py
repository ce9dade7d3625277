"""One way from a candidate folder to an imported kernel, whatever source found it.

The steps, in order: the tree's lock (store trees: held for the life of the process, so GC
keeps it), trust checks (inside its root, owner, modes, no symlink out), with `KERNELD_VERIFY=1`
a re-hash against its digest, the device check of `metadata.json`'s `backend.archs`, the
caller's own check (`before_import`), the dependencies, and the import under the metadata id.
Nothing of the tree runs before every check has passed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneld_client import _config, _deps, _path_trust, importer, locations
from kerneld_client._types import KernelRequest
from kerneld_client.errors import (
    CorruptTree,
    KernelLoadError,
    NoCompatibleVariant,
    UntrustedPath,
    VariantReason,
)
from kerneld_client.file_locks import TreeGone
from kerneld_client.loading import loaded as registry
from kerneld_client.loading.context import LoadContext, check_python_depends
from kerneld_client.loading.loaded import LoadedKernel
from kerneld_client.loading.sources import Candidate, TreeVanished
from kerneld_client.metadata import backend_of, kernel_depends

if TYPE_CHECKING:
    from kerneld_client.loading.sources import DependencyLoader


def materialize(
    candidate: Candidate, ctx: LoadContext, dependencies: DependencyLoader
) -> LoadedKernel:
    """Load the candidate (once per process). Raises TreeVanished when a store tree went away
    before it was locked, and the typed KernelError of the first check that fails."""
    if candidate.lock is not None:
        return _store_tree(candidate, candidate.lock, ctx, dependencies)
    if candidate.root is None:  # the caller's own folder: nothing to trust or verify
        existing = registry.registered(str(candidate.path))
        if existing is not None:
            return _reused(existing, candidate, ctx)
        return _finish(candidate.path, candidate, ctx, dependencies)
    real = _path_trust.check_tree(candidate.root, candidate.path)
    existing = registry.registered(str(real))
    if existing is not None:
        return _reused(existing, candidate, ctx)
    if _config.verify_trees():
        _verify(real, candidate)
    return _finish(real, candidate, ctx, dependencies)


def _store_tree(
    candidate: Candidate, lock: Path, ctx: LoadContext, dependencies: DependencyLoader
) -> LoadedKernel:
    """A tree of the host's store, which may be collected under us until it is locked."""
    root = candidate.root
    assert root is not None  # a store candidate always names its store
    tree = candidate.path
    abs_tree = tree if tree.is_absolute() else root.real_path / tree
    # Below the real root, a relative path without `..` is real unless one of its folders is
    # a symlink, which the trust walk after the lock refuses: only other paths are resolved.
    clean = not tree.is_absolute() and ".." not in tree.parts
    real_guess = str(abs_tree) if clean else os.path.realpath(abs_tree)
    existing = registry.registered(real_guess)
    if existing is not None:
        return _reused(existing, candidate, ctx)
    if not real_guess.startswith(root.real.rstrip("/") + "/"):
        # Before anything else (even the lock): a path that is not in our store is refused.
        raise UntrustedPath(
            f"{tree} is outside the store root {root.path}", repo_id=candidate.request.repo_id
        )
    try:
        taken = registry.hold(real_guess, lock, abs_tree)
    except (TreeGone, BlockingIOError, FileNotFoundError) as exc:
        raise TreeVanished(f"tree {candidate.digest} is being removed: {exc!r}") from exc
    try:
        real = _path_trust.check_real_tree(root, real_guess, tree)  # resolved once, then walked
        if _config.verify_trees():
            try:
                _verify(real, candidate)
            except CorruptTree as exc:
                _report_corrupt(exc, candidate)
                raise
        return _finish(real, candidate, ctx, dependencies)
    except BaseException:
        if taken:
            registry.release(real_guess)
        raise


def _reused(existing: LoadedKernel, candidate: Candidate, ctx: LoadContext) -> LoadedKernel:
    """A build this process imported already (maybe by a call with check_arch=False): the
    device check still applies to this call, as `kernels` checks before its import cache."""
    if ctx.options.check_arch:
        _check_device(existing.metadata, candidate, ctx)
    return existing


def _finish(
    real: Path, candidate: Candidate, ctx: LoadContext, dependencies: DependencyLoader
) -> LoadedKernel:
    """The checks on what the tree declares, its dependencies, then the one import."""
    request = candidate.request
    metadata = importer.read_metadata(real)
    if ctx.options.check_arch:
        _check_device(metadata, candidate, ctx)
    before = ctx.options.before_import
    # The default (python-depends installed?) has nothing to check when none is declared; it
    # would read metadata.json again to find that out.
    if before is not None and (
        before is not check_python_depends or metadata.get("python-depends")
    ):
        before(real, candidate.variant)
    deps = dependencies(metadata)
    with registry.importing(str(real)):
        existing = registry.registered(str(real))
        if existing is not None:
            return existing
        with _deps.providing(deps):
            # Store and hub-cache trees are immutable: their compiled code may be cached.
            module = importer.import_variant(
                real,
                real=candidate.root is not None,  # the trust checks resolved it
                cache_bytecode=candidate.source in ("index", "daemon", "hub"),
                own_folder=candidate.source == "local",
                metadata=metadata,
            )
        return registry.register(
            str(real),
            LoadedKernel(
                repo_id=request.repo_id,
                ref=request.ref,
                commit=candidate.commit,
                variant=candidate.variant,
                path=real,
                digest=candidate.digest,
                module=module,
                metadata=metadata,
                source=candidate.source,
            ),
        )


def dependency_requests(
    metadata: Mapping[str, Any], ctx: LoadContext, request: KernelRequest
) -> list[KernelRequest]:
    """What the kernel's `kernel-depends` ask for (a lock file's pin wins); a malformed list
    refuses the kernel, as the daemon refuses to serve it, instead of failing inside it later."""
    if metadata.get("kernel-depends") is None:
        return []
    try:
        depends = kernel_depends(metadata)
    except ValueError as exc:
        raise KernelLoadError(
            f"metadata.json: {exc}",
            repo_id=request.repo_id,
            revision=request.ref,
            hint="the kernel's build is malformed: ask its author to fix its kernel-depends",
        ) from None
    return [ctx.dependency_request(d.repo_id, d.version, d.revision) for d in depends]


def _check_device(metadata: Mapping[str, Any], candidate: Candidate, ctx: LoadContext) -> None:
    """Refuse, before import, a build whose `backend.archs` does not cover this device."""
    btype, archs = backend_of(metadata)
    if btype is None or not archs:
        return  # nothing declared: nothing to refuse (a CPU build declares no archs)
    from kerneld_client.variants.devices import device_compatible

    platform = ctx.platform
    ok, why = device_compatible(btype, archs, platform.backend_type, platform.device_capabilities)
    if not ok:
        raise NoCompatibleVariant(
            f"the build cannot run on this device: {why}",
            reasons=[VariantReason(candidate.variant, False, why)],
            repo_id=candidate.request.repo_id,
            revision=candidate.request.ref,
            hint="pass check_arch=False if the kernel supports more than it declares",
        )


def _verify(real: Path, candidate: Candidate) -> None:
    """`KERNELD_VERIFY=1`: re-hash the tree (its digest, else metadata.json's) before a single
    byte of it runs; CorruptTree on any difference, and the fallback policy takes over."""
    from kerneld_client import tree_verify

    request, variant = candidate.request, candidate.variant
    check = tree_verify.verify_tree(
        real,
        candidate.digest or None,
        repo_id=request.repo_id,
        revision=request.ref,
        variant=variant,
    )
    if check.tree_checked or check.metadata_checked:
        _config.log.debug(
            "verified %s@%s [%s]: %d files, %d bytes in %.2f ms",
            request.repo_id,
            request.ref,
            variant,
            check.files,
            check.bytes,
            check.seconds * 1e3,
        )
    else:
        _config.log.warning(
            "KERNELD_VERIFY: %s@%s [%s] at %s has no digest to verify against (no tree digest, "
            "no metadata.json digest); loading it as it is",
            request.repo_id,
            request.ref,
            variant,
            real,
        )


def _report_corrupt(exc: CorruptTree, candidate: Candidate) -> None:
    """Tell the daemon about a store tree that failed `KERNELD_VERIFY` (ReportSuspect), so it
    re-checks the tree itself and, if it agrees, takes it out of service and fetches it again:
    the next job does not meet the same damage, and nobody waits for the weekly scrub. Best
    effort: at most KERNELD_TIMEOUT, never raises; the fallback follows either way."""
    digest, request, variant = candidate.digest, candidate.request, candidate.variant
    if not digest:
        return
    try:
        from kerneld_client import _rpc

        answer = _rpc.report_suspect(
            locations.default_socket(),
            digest,
            repo_id=request.repo_id,
            commit=candidate.commit,
            variant=variant,
            # what differs, without the tree's path (the daemon knows where its trees are)
            reason=f"CorruptTree (KERNELD_VERIFY): {exc.message.split(' verification: ')[-1]}",
        )
    except Exception as err:  # a report must never change how the load fails
        _config.log.debug("could not report %s to kerneld: %r", digest, err)
        return
    if answer.verdict in ("unavailable", "rate-limited"):
        _config.log.debug("could not report %s to kerneld: %s", digest, answer.detail)
        return
    _config.log.warning(
        "KERNELD_VERIFY: reported %s@%s [%s] (tree %s) to kerneld; its verdict: %s (%s)",
        request.repo_id,
        request.ref,
        variant,
        digest,
        answer.verdict,
        answer.detail,
    )
