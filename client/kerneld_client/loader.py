"""Load kernels: the warm path over the published index, the RPC path, and the fallbacks.

The public functions carry the names and meaning of the `kernels` package (`get_kernel`,
`has_kernel`, `get_local_kernel`, `load_kernel`, `get_locked_kernel`, `get_kernel_variants`), so
code written for it works unchanged; kernels come from the host's kerneld store instead of a
per-process download.

Warm path (no RPC, no network, grpc not imported), in `_load`:
 1. platform facts (cached for the process);
 2. the per-repo document of the published client index (one small JSON read, owner-checked);
 3. ref -> commit; denies honoured; the best accepted variant that is present, unless the upstream
    has a better accepted one that is not cached yet (then it is a miss);
 4. the OFD read lock on the tree's lock file, kept for the life of the process (GC keeps the tree);
 5. trust checks on the tree (inside the store root, owner, modes, no symlink out); with
    `KERNELD_VERIFY=1` also a re-hash of every file against the tree digest (CorruptTree);
 6. `metadata.json` `backend.archs` against this process's devices, before any import;
 7. `kernel-depends` loaded first, then the import under the metadata id.
On a miss the daemon is asked (`_rpc`), and what it returns goes through steps 4-7 too.

Any failure ends in the fallback policy: the caller's `fallback=` object (or the typed error),
a verified in-process Hub download (`hub`), or the error (`error`, or `KERNELD_REQUIRE=1`).
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from kerneld_client import _config, _deps, _index, _trust, importer, locations
from kerneld_client._config import FallbackPolicy
from kerneld_client._types import KernelRequest, RepoInfo
from kerneld_client.errors import (
    GROUP_HINT,
    CorruptTree,
    DaemonUnavailable,
    KernelDenied,
    KernelError,
    KernelLoadError,
    KernelUnavailable,
    NoCompatibleVariant,
    UntrustedPath,
    VariantReason,
)
from kerneld_client.platform import platform_facts
from kerneld_client.variants import Decision, PlatformFacts, decide, device_compatible

if TYPE_CHECKING:
    from kerneld_client._rpc import Resolved

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
]


class _Missing:
    """Sentinel type: no `fallback=` object was given."""

    def __repr__(self) -> str:
        return "<no fallback>"


MISSING: Final = _Missing()


class LoadedKernel:
    """One kernel variant loaded into this process, and where it came from.

    `source` is `index` (warm path), `daemon` (RPC path), `hub` (the hub fallback) or `local`.
    (A plain slotted class: a frozen dataclass would cost a millisecond at import.)
    """

    __slots__ = (
        "commit",
        "digest",
        "metadata",
        "module",
        "path",
        "ref",
        "repo_id",
        "source",
        "variant",
    )

    def __init__(
        self,
        *,
        repo_id: str,
        ref: str,
        commit: str,
        variant: str,
        path: Path,
        digest: str,
        module: ModuleType,
        metadata: Mapping[str, Any],
        source: str,
    ) -> None:
        self.repo_id = repo_id
        self.ref = ref
        self.commit = commit
        self.variant = variant
        self.path = path
        self.digest = digest
        self.module = module
        self.metadata = metadata
        self.source = source

    @property
    def module_name(self) -> str:
        return self.module.__name__

    @property
    def repo_info(self) -> RepoInfo | None:
        """The repo and the revision asked for (`kernels`' field); None for a local kernel."""
        return None if self.source == "local" else RepoInfo(self.repo_id, self.ref)

    @property
    def provenance(self) -> _index.Provenance | None:
        """Who signed this tree, as kerneld checked it when the tree entered the store
        (`[provenance]`); None: nothing recorded (a local or hub-fallback kernel, or a daemon
        that checks no signatures). Taken from the index entry a warm load used, else read
        from the published index when asked, so loading costs nothing more."""
        if self.source not in ("index", "daemon"):
            return None
        if self.digest in _provenance_seen:  # the warm load read it already
            return _provenance_seen[self.digest]
        root = _store_root()
        if root is None:
            return None
        try:
            doc = _index.read_repo_index(Path(root.real), self.repo_id, owner_uid=root.owner_uid)
        except (OSError, _index.IndexFormatError):
            return None
        commit = None if doc is None else doc.commits.get(self.commit)
        entry = None if commit is None else commit.variants.get(self.variant)
        return entry.provenance if entry is not None and entry.digest == self.digest else None

    def __repr__(self) -> str:
        return (
            f"LoadedKernel({self.repo_id}@{self.ref} commit={self.commit[:12]} "
            f"variant={self.variant} module={self.module_name} source={self.source})"
        )


class _Options:
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
        # (folder, variant) -> None, or raises: a caller's own check of a verified tree before
        # its code runs (the start-up hook runs kernels' metadata validators here)
        self.before_import = before_import
        # repo -> locked commit, from a lock file (applies to dependencies too)
        self.locks: Mapping[str, str] = locks or {}
        # `kernels`' trust_remote_code: True, or the repos whose publisher the caller trusts
        trust = trust_remote_code
        self.trust: bool | frozenset[str] = trust if isinstance(trust, bool) else frozenset(trust)

    def trusts(self, repo_id: str) -> bool:
        """Did the caller accept `repo_id`'s code whoever published it?"""
        return self.trust is True or (not isinstance(self.trust, bool) and repo_id in self.trust)


# Hub repo ids: the characters the Hub allows; ".." is refused too (it names index files).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


class _Miss(Exception):
    """The index has no usable answer: ask the daemon."""


_lock = threading.RLock()
_loaded: dict[str, LoadedKernel] = {}  # by real tree path
_memo: dict[tuple[object, ...], LoadedKernel] = {}
_held: dict[str, int] = {}  # real tree path -> fd holding the OFD read lock (kept until exit)


def loaded_kernels() -> list[LoadedKernel]:
    """Every kernel variant loaded into this process (a new list, in load order)."""
    with _lock:
        return list(_loaded.values())


_versions_seen: dict[str, tuple[int, ...] | None] = {}  # repo -> versions, from index reads
#: tree digest -> who signed it, as the published index entry a warm load used said.
_provenance_seen: dict[str, _index.Provenance | None] = {}


def note_newer_version(req: KernelRequest, logger_name: str) -> None:
    """`kernels`' notice when a load by version is not the repo's newest version, on every
    such load as in `kernels`. The versions are the daemon's last upstream listing, from the
    index this load read (or read now, after an RPC)."""
    if req.version is None:
        return
    versions = (
        _versions_seen[req.repo_id]
        if req.repo_id in _versions_seen
        else upstream_versions(req.repo_id)
    )
    if versions and max(versions) > req.version:
        import logging

        logging.getLogger(logger_name).warning(
            "You are using version %d of '%s', but version %d is available.",
            req.version,
            req.repo_id,
            max(versions),
        )


def upstream_versions(repo_id: str) -> tuple[int, ...] | None:
    """Every `vN` the daemon saw upstream when it last resolved a version of `repo_id`, from
    the published index; None when it never listed them or there is no readable store."""
    root = _store_root()
    if root is None:
        return None
    try:
        doc = _index.read_repo_index(Path(root.real), repo_id, owner_uid=root.owner_uid)
    except (OSError, _index.IndexFormatError):
        return None
    return None if doc is None else doc.versions


def get_loaded_kernels() -> list[LoadedKernel]:
    """`kernels`' name for `loaded_kernels()`: one entry per variant folder loaded."""
    return loaded_kernels()


# ------------------------------------------------------------------------------- helpers


def _request(
    repo_id: str, version: int | None, revision: str | None, *, required: bool = True
) -> KernelRequest:
    """Validate the selector as `kernels` does: exactly one of version and revision."""
    if not isinstance(repo_id, str) or not _REPO_ID.fullmatch(repo_id) or ".." in repo_id:
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


def _local_overrides() -> dict[str, Path]:
    """`LOCAL_KERNELS=org/a=/path:org/b=/path`, as `kernels` reads it."""
    raw = _config.raw(_config.ENV_LOCAL_KERNELS)
    if not raw:
        return {}
    out: dict[str, Path] = {}
    for entry in raw.split(":"):
        if "=" not in entry:
            raise ValueError(
                f"Invalid LOCAL_KERNELS entry: {entry}. Expected repo_id_1=path_1:repo_id_2=path_2"
            )
        repo, path = entry.split("=", 1)
        out[repo] = Path(path)
    return out


def _store_root() -> _trust.StoreRoot | None:
    """The store this process reads, checked; None when there is none on this host."""
    try:
        return _trust.store_root(locations.default_store())
    except FileNotFoundError:
        return None


def _release(real: str) -> None:
    fd = _held.pop(real, None)
    if fd is not None:
        os.close(fd)


def _hold(real_tree: str, lock_path: Path, tree: Path) -> bool:
    """Take the OFD read lock on a tree for the process life; True if taken now (False: held)."""
    if real_tree in _held:
        return False
    _held[real_tree] = _index.lock_shared(lock_path, tree)
    return True


def _check_device(
    folder: Path, metadata: Mapping[str, Any], facts: PlatformFacts, ctx: dict[str, str]
) -> None:
    """Refuse, before import, a build whose `backend.archs` does not cover this device."""
    backend = metadata.get("backend")
    if not isinstance(backend, dict):
        return
    btype, archs = backend.get("type"), backend.get("archs") or []
    if not isinstance(btype, str) or not isinstance(archs, list):
        return
    ok, why = device_compatible(btype, [str(a) for a in archs], facts)
    if not ok:
        raise NoCompatibleVariant(
            f"the build cannot run on this device: {why}",
            reasons=[VariantReason(ctx.get("variant", folder.name), False, why)],
            repo_id=ctx.get("repo_id", ""),
            revision=ctx.get("revision", ""),
            hint="pass check_arch=False if the kernel supports more than it declares",
        )


def _dependency_requests(
    metadata: Mapping[str, Any], opts: _Options, req: KernelRequest
) -> list[KernelRequest]:
    """What the kernel's `kernel-depends` ask for (a lock file's pin wins); a malformed list
    refuses the kernel, as the daemon refuses to serve it, instead of failing inside it later."""
    if metadata.get("kernel-depends") is None:
        return []
    from kerneld_client._metadata import kernel_depends

    try:
        depends = kernel_depends(metadata)
    except ValueError as exc:
        raise KernelLoadError(
            f"metadata.json: {exc}",
            repo_id=req.repo_id,
            revision=req.ref,
            hint="the kernel's build is malformed: ask its author to fix its kernel-depends",
        ) from None
    return [
        KernelRequest(d.repo_id, locked_commit=opts.locks[d.repo_id])
        if d.repo_id in opts.locks
        else KernelRequest(d.repo_id, version=d.version, revision=d.revision)
        for d in depends
    ]


def _import_tree(
    real: Path,
    *,
    req: KernelRequest,
    commit: str,
    variant: str,
    digest: str,
    source: str,
    facts: PlatformFacts,
    opts: _Options,
    deps: Mapping[str, ModuleType] | None,
    stack: tuple[str, ...],
) -> LoadedKernel:
    """Steps 6-7 on a trusted folder: device check, dependencies, import, registration."""
    ctx = {"repo_id": req.repo_id, "revision": req.ref, "variant": variant}
    metadata = importer.read_metadata(real)
    if opts.check_arch:
        _check_device(real, metadata, facts, ctx)
    if opts.before_import is not None:
        opts.before_import(real, variant)
    if deps is None:
        deps = {}
        for dep_req in _dependency_requests(metadata, opts, req):
            deps[dep_req.repo_id] = _load(dep_req, facts, opts, stack).module
    with _deps.providing(deps):
        # Store and hub-cache trees are immutable: their compiled code may be cached.
        module = importer.import_variant(
            real,
            cache_bytecode=source in ("index", "daemon", "hub"),
            own_folder=source == "local",
        )
    loaded = LoadedKernel(
        repo_id=req.repo_id,
        ref=req.ref,
        commit=commit,
        variant=variant,
        path=real,
        digest=digest,
        module=module,
        metadata=metadata,
        source=source,
    )
    _loaded.setdefault(str(real), loaded)
    return _loaded[str(real)]


def _load_store_tree(
    root: _trust.StoreRoot,
    tree: Path,
    lock_path: Path,
    *,
    req: KernelRequest,
    commit: str,
    variant: str,
    digest: str,
    source: str,
    facts: PlatformFacts,
    opts: _Options,
    deps: Mapping[str, ModuleType] | None,
    stack: tuple[str, ...],
) -> LoadedKernel:
    """Steps 4-7 for a tree of the store; _Miss when it vanished under us (GC)."""
    abs_tree = tree if tree.is_absolute() else Path(root.real) / tree
    real_guess = os.path.realpath(abs_tree)
    if real_guess in _loaded:
        return _loaded[real_guess]
    if not real_guess.startswith(root.real.rstrip("/") + "/"):
        # Before anything else (even the lock): a path that is not in our store is refused.
        raise UntrustedPath(f"{tree} is outside the store root {root.path}", repo_id=req.repo_id)
    try:
        taken = _hold(real_guess, lock_path, abs_tree)
    except (_index.TreeGone, BlockingIOError, FileNotFoundError) as exc:
        raise _Miss(f"tree {digest} is being removed: {exc!r}") from exc
    try:
        real = _trust.check_tree(root, tree)
        if _config.verify_trees():
            try:
                _verify_before_import(real, digest, req, variant)
            except CorruptTree as exc:
                _report_corrupt(exc, digest, req, commit, variant)
                raise
        return _import_tree(
            real,
            req=req,
            commit=commit,
            variant=variant,
            digest=digest,
            source=source,
            facts=facts,
            opts=opts,
            deps=deps,
            stack=stack,
        )
    except BaseException:
        if taken:
            _release(real_guess)
        raise


def _verify_before_import(real: Path, digest: str | None, req: KernelRequest, variant: str) -> None:
    """`KERNELD_VERIFY=1`: re-hash the tree (its digest, else metadata.json's) before a single
    byte of it runs; CorruptTree on any difference, and the fallback policy takes over."""
    from kerneld_client import _verify

    check = _verify.verify_tree(
        real, digest, repo_id=req.repo_id, revision=req.ref, variant=variant
    )
    if check.tree_checked or check.metadata_checked:
        _config.log.debug(
            "verified %s@%s [%s]: %d files, %d bytes in %.2f ms",
            req.repo_id,
            req.ref,
            variant,
            check.files,
            check.bytes,
            check.seconds * 1e3,
        )
    else:
        _config.log.warning(
            "KERNELD_VERIFY: %s@%s [%s] at %s has no digest to verify against (no tree digest, "
            "no metadata.json digest); loading it as it is",
            req.repo_id,
            req.ref,
            variant,
            real,
        )


def _report_corrupt(
    exc: CorruptTree, digest: str, req: KernelRequest, commit: str, variant: str
) -> None:
    """Tell the daemon about a store tree that failed `KERNELD_VERIFY` (ReportSuspect), so it
    re-checks the tree itself and, if it agrees, takes it out of service and fetches it again:
    the next job does not meet the same damage, and nobody waits for the weekly scrub. Best
    effort: at most KERNELD_TIMEOUT, never raises; the fallback follows either way."""
    if not digest:
        return
    try:
        from kerneld_client import _rpc

        answer = _rpc.report_suspect(
            locations.default_socket(),
            digest,
            repo_id=req.repo_id,
            commit=commit,
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
        req.repo_id,
        req.ref,
        variant,
        digest,
        answer.verdict,
        answer.detail,
    )


# ------------------------------------------------------------------------------- index


class _Pick:
    __slots__ = ("commit", "entry", "stale_ref")

    def __init__(self, commit: str, entry: _index.VariantEntry, stale_ref: bool) -> None:
        self.commit = commit
        self.entry = entry
        self.stale_ref = stale_ref


def _publisher_trusted(root: _trust.StoreRoot, repo_id: str, opts: _Options) -> bool:
    """The daemon's `[trust]` verdict as published; anything unreadable is a question for it.
    A store without the file was never served by a daemon that checks publishers (kerneld
    writes it whenever it opens the store): its index is trusted as it was before the check."""
    try:
        publishers = _index.read_publishers(Path(root.real), owner_uid=root.owner_uid)
    except (OSError, _index.IndexFormatError):
        return False
    return publishers is None or publishers.trusts(repo_id, trust_remote_code=opts.trusts(repo_id))


def _pick_from_index(
    root: _trust.StoreRoot, req: KernelRequest, facts: PlatformFacts, opts: _Options
) -> _Pick | None:
    """The tree to load, or None for a miss (ask the daemon).

    Raises KernelDenied, and NoCompatibleVariant when the commit's full variant list is known
    and none fits: both are final for an immutable commit.
    """
    try:
        doc = _index.read_repo_index(Path(root.real), req.repo_id, owner_uid=root.owner_uid)
    except PermissionError as exc:
        if exc.errno == errno.EACCES:  # the store is not readable by this user: not untrusted
            raise KernelUnavailable(
                f"no permission to read the host's kernel store ({exc.filename})",
                repo_id=req.repo_id,
                hint=GROUP_HINT,
            ) from exc
        raise UntrustedPath(f"published index: {exc}", repo_id=req.repo_id) from exc
    except _index.IndexFormatError:
        return None  # the daemon will know
    if doc is None:
        return None
    _versions_seen[req.repo_id] = doc.versions
    commit = doc.commit_for(req.ref)
    reason = doc.deny_reason(req.ref, commit)
    if reason is not None:
        raise KernelDenied(reason, repo_id=req.repo_id, revision=req.ref)
    if not _publisher_trusted(root, req.repo_id, opts):
        return None  # the daemon decides, and says why if it refuses
    entry = doc.commits.get(commit) if commit is not None else None
    if commit is None or entry is None:
        return None
    present = decide(entry.variants, facts)
    best_present = next((d.variant for d in present if d.accepted), None)
    if entry.upstream_variants is not None:
        upstream = decide(entry.upstream_variants, facts)
        if not any(d.accepted for d in upstream):
            raise NoCompatibleVariant(
                f"no build variant fits this platform ({facts.describe()})",
                reasons=[VariantReason(d.variant, d.accepted, d.reason) for d in upstream],
                repo_id=req.repo_id,
                revision=commit,
            )
        if upstream[0].variant != best_present:
            return None  # a better variant exists upstream: the daemon will fetch it
    if best_present is None:
        return None
    stale = False
    max_age = _config.ref_max_age_s()
    if max_age is not None and req.ref in doc.refs:
        stale = time.time() - doc.refs[req.ref][1] > max_age
    return _Pick(commit, entry.variants[best_present], stale)


# ------------------------------------------------------------------------------- the core


def _load(
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    stack: tuple[str, ...] = (),
) -> LoadedKernel:
    """Index, then daemon; raises a KernelError (never falls back: the callers do)."""
    if req.repo_id in stack:
        raise KernelLoadError(
            "kernel-depends cycle: " + " -> ".join((*stack, req.repo_id)), repo_id=req.repo_id
        )
    stack = (*stack, req.repo_id)
    overrides = _local_overrides()
    if req.repo_id in overrides:
        return _load_local(overrides[req.repo_id], facts, opts, repo_id=req.repo_id)
    root = _store_root()
    stale_pick: _Pick | None = None
    if root is not None:
        pick = _pick_from_index(root, req, facts, opts)
        if pick is not None and pick.stale_ref:
            stale_pick = pick  # older than KERNELD_REF_MAX_AGE: the daemon re-checks the ref
        elif pick is not None:
            try:
                return _load_pick(root, pick, req, facts, opts, stack)
            except _Miss:
                pass
    try:
        if stale_pick is not None or not opts.allow_fetch:
            return _load_via_daemon(root, req, facts, opts, stack)
        return _load_cold(root, req, facts, opts, stack)
    except DaemonUnavailable:
        if stale_pick is None or root is None:
            raise
        try:
            return _load_pick(root, stale_pick, req, facts, opts, stack)
        except _Miss:
            raise KernelUnavailable(
                "the ref's tree is being removed and kerneld is unavailable",
                repo_id=req.repo_id,
                revision=req.ref,
            ) from None


def _load_cold(
    root: _trust.StoreRoot | None,
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    stack: tuple[str, ...],
) -> LoadedKernel:
    """Ask the daemon, unless another process of this user is asking it for the same kernel
    right now: then wait for that answer and read the index it published (`_coalesce`)."""
    from kerneld_client import _coalesce  # the cold path only

    socket_path = locations.default_socket()
    with _coalesce.turn(socket_path, req, _config.fetch_timeout_s()) as ask:
        if ask:
            return _load_via_daemon(root, req, facts, opts, stack)
    root = root or _store_root()
    if root is not None:
        pick = _pick_from_index(root, req, facts, opts)
        if pick is not None and not pick.stale_ref:
            try:
                return _load_pick(root, pick, req, facts, opts, stack)
            except _Miss:
                pass
    return _load_via_daemon(root, req, facts, opts, stack)


def _load_pick(
    root: _trust.StoreRoot,
    pick: _Pick,
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    stack: tuple[str, ...],
) -> LoadedKernel:
    _provenance_seen[pick.entry.digest] = pick.entry.provenance
    return _load_store_tree(
        root,
        Path(pick.entry.tree),
        Path(root.real) / pick.entry.lock,
        req=req,
        commit=pick.commit,
        variant=pick.entry.name,
        digest=pick.entry.digest,
        source="index",
        facts=facts,
        opts=opts,
        deps=None,
        stack=stack,
    )


def _load_via_daemon(
    root: _trust.StoreRoot | None,
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    stack: tuple[str, ...],
) -> LoadedKernel:
    from kerneld_client import _rpc

    # The daemon may publish this repo's version list as it answers: read it again afterwards.
    _versions_seen.pop(req.repo_id, None)
    socket_path = locations.default_socket()
    try:
        resolved = _rpc.resolve(
            socket_path,
            req,
            facts,
            allow_fetch=opts.allow_fetch,
            trust_remote_code=opts.trusts(req.repo_id),
        )
    except KernelError:
        raise
    except ImportError as exc:  # grpc or protobuf missing or broken
        raise DaemonUnavailable(f"cannot talk to kerneld: {exc}", repo_id=req.repo_id) from exc
    if root is None:
        # The daemon answered, so its store exists now (it may have just been created).
        root = _store_root()
        if root is None:
            raise UntrustedPath(
                "kerneld returned a path, but this process does not know the store root",
                repo_id=req.repo_id,
                hint="set KERNELD_STORE, or let kerneld write its advert beside the socket",
            )
    return _load_resolved(root, resolved, req, facts, opts, stack)


def _load_resolved(
    root: _trust.StoreRoot,
    resolved: Resolved,
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    stack: tuple[str, ...],
) -> LoadedKernel:
    """A daemon answer: its dependencies first (in the daemon's order), then the kernel."""
    deps: dict[str, ModuleType] = {}
    for dep in resolved.dependencies:
        dep_req = KernelRequest(dep.repo_id, revision=dep.ref or dep.commit)
        deps[dep.repo_id] = _load_resolved(root, dep, dep_req, facts, opts, stack).module
    try:
        lock = _index.lock_path_for(Path(root.real), resolved.digest)
        tree = _index.tree_relpath_for(resolved.path, resolved.digest)
    except _index.IndexFormatError as exc:
        # Whatever answered on the socket did not name a tree of the store by its digest.
        raise UntrustedPath(f"kerneld's answer refused: {exc}", repo_id=req.repo_id) from exc
    try:
        return _load_store_tree(
            root,
            tree,  # under this process's store root, wherever the daemon sees the store
            lock,
            req=req,
            commit=resolved.commit,
            variant=resolved.variant,
            digest=resolved.digest,
            source="daemon",
            facts=facts,
            opts=opts,
            deps=deps,
            stack=stack,
        )
    except _Miss as exc:
        if not (Path(root.real) / tree.parent).is_dir():
            raise KernelUnavailable(
                f"kerneld answered with a tree of its store, but {root.path} (this process's "
                f"store root) holds no {tree.parent}/: the daemon's store is not there",
                repo_id=req.repo_id,
                hint="mount the host's store at that path (read-only is fine), or point "
                "KERNELD_STORE at it (docs/containers.md)",
            ) from exc
        raise KernelUnavailable(
            f"the tree kerneld returned disappeared: {exc}", repo_id=req.repo_id
        ) from exc


def _load_local(path: Path, facts: PlatformFacts, opts: _Options, *, repo_id: str) -> LoadedKernel:
    """A kernel repository (or variant folder) on local disk: no store, no trust checks."""
    candidates: list[str] = []
    folder: Path | None = None
    for base in (path, path / "build"):
        if not base.is_dir():
            continue
        names = sorted(p.name for p in base.iterdir() if p.is_dir())
        decisions = decide(names, facts)
        if decisions and decisions[0].accepted:
            folder = base / decisions[0].variant
            break
        candidates = names or candidates
    if folder is None and (path / "metadata.json").is_file():
        folder = path
    if folder is None:
        decisions = decide(candidates, facts)
        raise NoCompatibleVariant(
            f"cannot find a build variant for this system in {path}",
            reasons=[VariantReason(d.variant, d.accepted, d.reason) for d in decisions],
            repo_id=repo_id,
        )
    real = folder.resolve()
    with _lock:
        if str(real) in _loaded:
            return _loaded[str(real)]
        return _import_tree(
            real,
            req=KernelRequest(repo_id, revision=str(path)),
            commit="",
            variant=folder.name,
            digest="",
            source="local",
            facts=facts,
            opts=opts,
            deps=None,
            stack=(repo_id,),
        )


def _load_from_hub(
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    *,
    trust_remote_code: bool | list[str],
    user_agent: str | dict[str, str] | None,
) -> LoadedKernel:
    """The `hub` fallback: admin denies still apply; the download is verified; the cache must
    belong to this user."""
    from kerneld_client import _hub

    try:
        root = _store_root()
    except UntrustedPath as exc:
        # An untrusted store's deny list is no more trustworthy than its trees; refusing the
        # fallback on its account would let whoever planted it block every job.
        _config.log.warning("hub fallback without the host's deny list: %s", exc)
        root = None
    denies: list[tuple[str, str, str]] = []
    if root is not None:
        try:
            denies = _index.read_denies(Path(root.real), owner_uid=root.owner_uid)
        except (PermissionError, _index.IndexFormatError):
            denies = []

    def check_denied(*revisions: str) -> None:
        for repo, revision, reason in denies:
            if repo == req.repo_id and revision in (_index.ALL, *revisions):
                raise KernelDenied(reason or "denied on this host", repo_id=req.repo_id)

    check_denied(req.ref)
    cache = _config.hub_cache_dir()
    tree = _hub.fetch(
        req.repo_id,
        version=req.version,
        revision=req.locked_commit or req.revision,
        facts=facts,
        cache_root=cache,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )
    check_denied(tree.commit)
    cache_root = _trust.store_root(cache)
    if cache_root.owner_uid != os.geteuid():
        raise UntrustedPath(f"the hub cache {cache} belongs to uid {cache_root.owner_uid}")
    real = _trust.check_tree(cache_root, tree.path)
    if str(real) in _loaded:
        return _loaded[str(real)]
    if _config.verify_trees():
        _verify_before_import(real, None, req, tree.variant)
    # Dependencies: from kerneld when it can, else from the Hub as well.
    deps: dict[str, ModuleType] = {}
    for dep_req in _dependency_requests(importer.read_metadata(real), opts, req):
        try:
            deps[dep_req.repo_id] = _load(dep_req, facts, opts, (req.repo_id,)).module
        except KernelError:
            deps[dep_req.repo_id] = _load_from_hub(
                dep_req, facts, opts, trust_remote_code=trust_remote_code, user_agent=user_agent
            ).module
    return _import_tree(
        real,
        req=req,
        commit=tree.commit,
        variant=tree.variant,
        digest="",
        source="hub",
        facts=facts,
        opts=opts,
        deps=deps,
        stack=(req.repo_id,),
    )


# ------------------------------------------------------------------------------- fallback


def _as_kernel_error(exc: BaseException, req: KernelRequest) -> KernelError:
    if isinstance(exc, KernelError):
        return exc
    wrapped = KernelLoadError(f"unexpected failure: {exc!r}", repo_id=req.repo_id, revision=req.ref)
    wrapped.__cause__ = exc
    return wrapped


def _run(
    req: KernelRequest,
    *,
    backend: str | None,
    opts: _Options,
    fallback: object,
    policy: str | FallbackPolicy | None,
    hub_allowed: bool,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> Any:
    """Load with the fallback policy applied; the memo makes repeated calls cheap."""
    chosen = _config.fallback_policy(policy)  # ValueError for a bad name: a usage error
    facts = platform_facts(backend)  # ValueError for a bad backend, as in `kernels`
    locks = tuple(sorted(opts.locks.items()))
    key = (req, backend, opts.check_arch, opts.allow_fetch, locks, opts.trust)
    with _lock:
        memo = _memo.get(key)
        if memo is not None:
            return memo.module
        try:
            loaded = _load(req, facts, opts)
        except Exception as exc:
            error = _as_kernel_error(exc, req)
        else:
            _memo[key] = loaded
            return loaded.module
        return _fall_back(
            error,
            req,
            facts,
            opts,
            fallback=fallback,
            policy=chosen,
            hub_allowed=hub_allowed,
            trust_remote_code=trust_remote_code,
            user_agent=user_agent,
            key=key,
        )


def _fall_back(
    error: KernelError,
    req: KernelRequest,
    facts: PlatformFacts,
    opts: _Options,
    *,
    fallback: object,
    policy: FallbackPolicy,
    hub_allowed: bool,
    trust_remote_code: bool | list[str],
    user_agent: str | dict[str, str] | None,
    key: tuple[object, ...],
) -> Any:
    what = f"{req.repo_id}@{req.ref}"
    if _config.require() or policy is FallbackPolicy.ERROR:
        raise error
    final_terms = isinstance(error, KernelDenied | NoCompatibleVariant)
    if policy is FallbackPolicy.HUB and hub_allowed and not final_terms:
        from kerneld_client import _hub

        if _hub.available():
            try:
                loaded = _load_from_hub(
                    req, facts, opts, trust_remote_code=trust_remote_code, user_agent=user_agent
                )
            except Exception as exc:
                hub_error = _as_kernel_error(exc, req)
                hub_error.__context__ = error
                error = hub_error
            else:
                _memo[key] = loaded
                _config.warn_once(
                    req.repo_id,
                    f"kerneld could not provide kernel {what} ({error.message}); "
                    "loaded it directly from the Hub",
                )
                return loaded.module
    if fallback is MISSING:
        raise error
    _config.warn_once(
        req.repo_id, f"cannot load kernel {what} ({error.message}); using the fallback"
    )
    return fallback


# ------------------------------------------------------------------------------- public API


def get_kernel(
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
    """Load a kernel from the host's kerneld store (fetched by the daemon if needed).

    Exactly one of `version` (branch `vN`) and `revision` (branch, tag or commit). On failure:
    `policy` (default $KERNELD_FALLBACK, else `torch`) decides; under `torch` the `fallback`
    object is returned if one was given, else the typed error is raised. `trust_remote_code`
    (True, or a list of repo ids) accepts a publisher the host's `[trust]` policy does not
    trust, as in `kernels` (unless the admin turned that off); `user_agent` matters only to the
    `hub` fallback.
    """
    req = _request(repo_id, version, revision)
    module = _run(
        req,
        backend=backend,
        opts=_Options(check_arch=check_arch, trust_remote_code=trust_remote_code),
        fallback=fallback,
        policy=policy,
        hub_allowed=True,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
    )
    if version is not None and module is not fallback:
        note_newer_version(req, "kerneld_client")
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
    req = _request(repo_id, version, revision)
    facts = platform_facts(backend)
    if req.repo_id in _local_overrides():
        return True
    try:
        return _has_variant(req, facts, check_arch=check_arch)
    except KernelError:
        return False


def _has_variant(req: KernelRequest, facts: PlatformFacts, *, check_arch: bool) -> bool:
    """has_kernel's answer from the index or the daemon; raises the KernelError that made it
    unknowable (the `kernels` integration tells "no" from "kerneld is unavailable")."""
    decisions, archs = _variants(req, facts)
    best = next((d for d in decisions if d.accepted), None)
    if best is None:
        return False
    if check_arch and best.variant in archs:
        btype, declared = archs[best.variant]
        return device_compatible(btype, declared, facts)[0]
    return True


def _variants(
    req: KernelRequest, facts: PlatformFacts
) -> tuple[list[Decision], dict[str, tuple[str, list[str]]]]:
    """Verdicts for every variant, from the index when it knows them all, else the daemon;
    plus (backend, archs) of the variants present in the store."""
    root = _store_root()
    archs: dict[str, tuple[str, list[str]]] = {}
    if root is not None:
        try:
            doc = _index.read_repo_index(Path(root.real), req.repo_id, owner_uid=root.owner_uid)
        except PermissionError as exc:
            raise UntrustedPath(f"published index: {exc}", repo_id=req.repo_id) from exc
        except _index.IndexFormatError:
            doc = None
        if doc is not None:
            commit = doc.commit_for(req.ref)
            reason = doc.deny_reason(req.ref, commit)
            if reason is not None:
                raise KernelDenied(reason, repo_id=req.repo_id, revision=req.ref)
            entry = doc.commits.get(commit) if commit is not None else None
            if entry is not None:
                archs = {n: (v.backend or "", list(v.archs)) for n, v in entry.variants.items()}
                if entry.upstream_variants is not None:
                    return decide(entry.upstream_variants, facts), archs
    from kerneld_client import _rpc

    try:
        _, decisions = _rpc.list_variants(locations.default_socket(), req, facts)
    except ImportError as exc:
        raise DaemonUnavailable(f"cannot talk to kerneld: {exc}", repo_id=req.repo_id) from exc
    return list(decisions), archs


def get_kernel_variants(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
) -> list[Decision]:
    """Every build variant of the revision with its verdict for this process, accepted ones
    first (best first), then the rejected ones with their reasons. Raises typed errors."""
    req = _request(repo_id, version, revision)
    return _variants(req, platform_facts(backend))[0]


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
    path = Path(repo_path)
    facts = platform_facts(backend)
    return _load_local(path, facts, _Options(check_arch=check_arch), repo_id=str(path)).module


def _caller_lockfile() -> tuple[str, str]:
    """(text, source) of `kernels.lock` in the calling package's distribution metadata."""
    import importlib.metadata
    import inspect

    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__", "").startswith("kerneld_client"):
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    package = module.split(".")[0]
    for dist_name in importlib.metadata.packages_distributions().get(package, []):
        text = importlib.metadata.distribution(dist_name).read_text("kernels.lock")
        if text is not None:
            return text, f"{dist_name} (kernels.lock)"
    raise ValueError(
        f"could not find a `kernels.lock` in the metadata of the package of {module or '?'}; "
        "lock the project's kernels (`kernels lock`) and reinstall it, or pass lockfile="
    )


def _locked(repo_id: str, lockfile: str | os.PathLike[str] | None) -> dict[str, str]:
    """Every repo -> commit of the lock file; ValueError (LockfileError) when `repo_id` is not
    locked there (a project error, as in `kernels`)."""
    from kerneld_client import lockfile as lf

    if lockfile is None:
        text, source = _caller_lockfile()
        parsed = lf.parse_lockfile(text, source=source)
    else:
        parsed = lf.load_lockfile(lockfile)
    commits: dict[str, str] = {}
    for repo, commit, _ref in parsed.pinned():
        commits.setdefault(repo, commit)
    if repo_id not in commits:
        raise ValueError(
            f"Kernel `{repo_id}` is not locked in {parsed.source}; lock it with `kernels lock`"
        )
    return commits


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
    locks = _locked(repo_id, lockfile)
    req = KernelRequest(repo_id, locked_commit=locks[repo_id])
    return _run(
        req,
        backend=backend,
        opts=_Options(check_arch=check_arch, allow_fetch=False, locks=locks),
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
    locks = _locked(repo_id, lockfile)
    req = KernelRequest(repo_id, locked_commit=locks[repo_id])
    return _run(
        req,
        backend=backend,
        opts=_Options(
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
