"""A kernel repository as the Hub API shows it, answered from the daemon's store.

What a Hub client sees of a repo here is its `build/` tree: every variant the upstream lists
for a commit, each with its files, sizes and content ids. A variant in the store is listed from
the store (the ids its upstream announced at ingest, so the listing never changes once a
variant is fetched); one not fetched yet is listed by asking the upstream chain once per commit
(commits are immutable: the answer is kept for the daemon's lifetime). Bytes always come from
the store: a file of a variant that is not here makes the daemon fetch the whole variant first
(single-flight, verified, under `[fetch]`), so the Hub sees one download per variant per host
however many processes ask.

Every decision is the acquire path's (`kerneld.pipeline.acquire`, with the daemon's gate in
`kerneld.server.services.gate`), as for a Resolve: field bounds, denies, publisher trust (once the
repo is known to exist), the provenance gate
(`signed`: under `[provenance] policy = "require"` a commit with a variant the store would refuse is
refused whole, on every route that answers about its tree), the fetch gate with its per-uid budget
and audit line, and the one single-flight fetcher. Refs and revisions go through the acquire path
too (the resolver's TTL cache, the same stale answer when every upstream is down); the view never
asks an upstream itself. What every upstream failed to
answer is not asked again for `LISTING_RETRY_S`: during an outage a job costs the upstreams nothing
more than the first one did, restart or not.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from kerneld.config import Config
from kerneld.pipeline.acquire import Acquire
from kerneld.pipeline.plans import Named
from kerneld.pipeline.resolve import LISTING_RETRY_S, FetchNotAllowed, KernelSpec
from kerneld.server.plumbing.identity import Caller
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.services.gate import DaemonGate
from kerneld.server.statuses import RateLimited
from kerneld.store import (
    Catalog,
    Facts,
    Policy,
    ProvenanceError,
    PublishedFile,
    PublishedIndex,
    ResourceExhaustedError,
)
from kerneld.store.manifest import SIGSTORE_FILE
from kerneld.upstream.base import Refs, RemoteFile
from kerneld.upstream.errors import EntryNotFound, RepoNotFound, UpstreamError, every_upstream
from kerneld_client.vocabulary import is_commit

#: Commits whose unfetched variants' listings are kept in memory (LRU).
MAX_LISTED_COMMITS = 1024
#: Store meta key (+ repo id) of the last refs listing an upstream gave.
REFS_META = "hub-api/refs/"
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"


def git_blob_id(data: bytes) -> str:
    """git's object id of a blob with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class HubFile:
    """One file as the Hub lists it: an LFS file (`sha256` set) or a plain git blob."""

    path: str
    """Repo-relative: `build/<variant>/<path in the variant>`."""
    size: int
    sha256: str | None
    git_sha1: str | None

    @property
    def oid(self) -> str:
        """The git blob id: the file's own, or its LFS pointer's (as the Hub lists them)."""
        if self.sha256 is None:
            return self.git_sha1 or ""
        pointer = LFS_POINTER.format(sha256=self.sha256, size=self.size)
        return git_blob_id(pointer.encode())

    @property
    def etag(self) -> str:
        """What `huggingface_hub` keys its cache on: the sha256 of an LFS file, else the blob id."""
        return self.sha256 or self.oid

    @property
    def pointer_size(self) -> int:
        return len(LFS_POINTER.format(sha256=self.sha256, size=self.size).encode())

    @property
    def variant(self) -> str:
        return self.path.split("/", 2)[1]

    @classmethod
    def published(cls, variant: str, f: PublishedFile) -> HubFile:
        """A stored file, shown as its upstream announced it (a 40-hex id: a plain blob)."""
        path = f"build/{variant}/{f.path}"
        if f.upstream_id is not None and len(f.upstream_id) == 40:
            return cls(path, f.size, None, f.upstream_id)
        return cls(path, f.size, f.sha256, None)

    @classmethod
    def remote(cls, variant: str, f: RemoteFile) -> HubFile:
        return cls(
            f"build/{variant}/{f.path}", f.size, f.sha256, f.git_sha1 if not f.sha256 else None
        )


class NotAKernelRepo(RepoNotFound):
    """The repo exists upstream but has no `build/` tree: the endpoint serves only kernels."""


class HubStore(Protocol):
    """What the endpoint reads of the store: listings, trees (gated), refs and its own notes."""

    @property
    def published(self) -> PublishedIndex: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def names(self) -> Policy: ...

    @property
    def meta(self) -> Facts: ...


class HubHost(Protocol):
    """What the endpoint needs of the daemon (kerneld.server.core.Core implements it)."""

    @property
    def config(self) -> Config: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def store(self) -> HubStore: ...

    @property
    def acquire(self) -> Acquire: ...

    @property
    def gate(self) -> DaemonGate: ...

    def work(self) -> AbstractContextManager[None]: ...


class HubView:
    """The store and the acquire path, answering the questions Hub clients ask."""

    def __init__(self, core: HubHost) -> None:
        self.core = core
        self._lock = threading.Lock()
        self._refs: dict[str, tuple[Refs, float]] = {}
        self._listed: OrderedDict[tuple[str, str], dict[str, list[HubFile]]] = OrderedDict()
        self._complete: OrderedDict[tuple[str, str], tuple[int, list[HubFile]]] = OrderedDict()
        self._failed: OrderedDict[tuple[str, str], tuple[float, UpstreamError]] = OrderedDict()
        """(repo, commit or "refs") -> when and how every upstream last failed to list it."""

    # -- policy ---------------------------------------------------------------------------------

    def check(self, repo_id: str, revision: str, commit: str | None = None) -> None:
        """Field bounds and denies, before anything is asked (publisher trust comes once the
        repo is known to exist: `files`, `refs`)."""
        acquire = self.core.acquire
        acquire.check_fields(repo_id, revision)
        acquire.check_denied(repo_id, revision, commit)

    def _check_publisher(self, repo_id: str) -> None:
        """A Hub client cannot pass `trust_remote_code`: `[trust] allow` is how an admin
        admits another publisher."""
        self.core.acquire.check_publisher(repo_id, trust_remote_code=False)

    def org_trusted(self, org: str, caller: Caller | None = None) -> bool:
        """Does this host trust every kernel of `org` (what `kernels` asks the Hub's
        organisation overview)? PublisherUnknown when the Hub has no such organisation (a
        404: `kernels` then says it could not verify), PublisherUnverified when it cannot be
        asked now (503); asking costs the caller one fetch of its budget."""
        self.core.acquire.check_fields(f"{org}/x")
        return self.core.gate.org_verdict(org, caller)

    def requires_signatures(self) -> bool:
        return self.core.config.provenance_policy == "require"

    def signed(self, repo_id: str, commit: str, files: list[HubFile]) -> None:
        """The provenance gate of every answer about a tree (listings, revision info, HEAD and
        GET of a file): under `[provenance] policy = "require"` a commit is refused whole
        (ProvenanceError, a 403 saying why) when any of its variants is refused: one whose
        listing has no signature bundle, or one in the store whose tree is not recorded as
        verified (the store's own gate, as for the bytes). A variant not fetched yet whose
        bundle is listed passes here; its bytes are checked when they are fetched."""
        if not self.requires_signatures():
            return
        paths = {f.path for f in files}
        for variant in sorted({f.variant for f in files}):
            if f"build/{variant}/{SIGSTORE_FILE}" not in paths:
                raise ProvenanceError(
                    "unsigned",
                    f"the variant has no {SIGSTORE_FILE}",
                    repo_id=repo_id,
                    commit=commit,
                    variant=variant,
                )
            self.core.store.catalog.published_files(repo_id, commit, variant)

    def may_fetch(self, repo_id: str, caller: Caller) -> bool:
        """May this caller's request reach the upstreams (`[fetch] allow`, `allow_groups`)?"""
        return self.core.gate.may_fetch(caller, repo_id)

    def _recent_failure(self, key: tuple[str, str]) -> UpstreamError | None:
        with self._lock:
            failed = self._failed.get(key)
        if failed is not None and time.time() - failed[0] < LISTING_RETRY_S:
            return failed[1]
        return None

    def _remember_failure(self, key: tuple[str, str], error: UpstreamError) -> None:
        with self._lock:
            self._failed[key] = (time.time(), error)
            self._failed.move_to_end(key)
            while len(self._failed) > MAX_LISTED_COMMITS:
                self._failed.popitem(last=False)

    # -- refs -----------------------------------------------------------------------------------

    def refs(self, repo_id: str, caller: Caller) -> Refs:
        """Branches and tags: from the upstream chain within `[resolve] ref_ttl`; when every
        upstream fails (or fetching is not allowed) the last answer, kept in the store so that
        it outlives a restart (`kernels` picks `version=N`'s branch from this listing, and may
        then ask for the commit it names: no ref row is ever recorded for it); else the refs
        this store has resolved."""
        self.check(repo_id, "main")
        refs = self._refs_of(repo_id, caller)
        self._check_publisher(repo_id)  # it exists: its publisher may be asked about
        return refs

    def _refs_of(self, repo_id: str, caller: Caller) -> Refs:
        ttl = self.core.config.ref_ttl_s
        with self._lock:
            cached = self._refs.get(repo_id)
        if cached is not None and time.time() - cached[1] < ttl:
            return cached[0]
        failures: list[UpstreamError] = []
        refusal: FetchNotAllowed | RateLimited | None = None
        recent = self._recent_failure((repo_id, "refs"))
        if recent is not None:
            failures.append(recent)
        elif (refusal := self._open_network(caller, repo_id, f"repo={repo_id} refs")) is None:
            refs = self.core.acquire.upstream_refs(repo_id, failures)
            if refs is not None:
                with self._lock:
                    self._refs[repo_id] = (refs, time.time())
                if cached is None or cached[0] != refs:
                    self._save_refs(repo_id, refs)
                return refs
            if failures and not all(isinstance(f, RepoNotFound) for f in failures):
                self._remember_failure((repo_id, "refs"), failures[0])
        if cached is None:
            cached = self._saved_refs(repo_id)
        if cached is not None:
            return cached[0]
        known = self.core.store.names.refs_of(repo_id)
        if known:
            branches = {r.ref: r.commit for r in known if not is_commit(r.ref)}
            return Refs(branches={k.removeprefix("refs/heads/"): v for k, v in branches.items()})
        if failures:  # an outage outweighs a "not found" from a mirror that lacks the repo
            chosen = next((f for f in failures if not isinstance(f, RepoNotFound)), failures[0])
            raise every_upstream(failures, chosen, repo_id=repo_id, revision="")
        if refusal is not None:
            raise refusal
        raise FetchNotAllowed(
            "not known to this host, and the fetch policy does not let this caller ask upstream",
            repo_id=repo_id,
        )

    def _save_refs(self, repo_id: str, refs: Refs) -> None:
        doc = {"branches": refs.branches, "tags": refs.tags, "at": time.time()}
        self.core.store.meta.set(REFS_META + repo_id, json.dumps(doc, sort_keys=True))

    def _saved_refs(self, repo_id: str) -> tuple[Refs, float] | None:
        raw = self.core.store.meta.get(REFS_META + repo_id)
        if not raw:
            return None
        try:
            doc = json.loads(raw)
            return Refs(dict(doc["branches"]), dict(doc["tags"])), float(doc.get("at", 0.0))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def _open_network(
        self, caller: Caller, repo_id: str, what: str
    ) -> FetchNotAllowed | RateLimited | None:
        """Admit a question to the upstreams (the daemon's fetch gate, budget and audit line):
        None, or the refusal, which the caller raises if what is here cannot answer (a refused
        caller still gets what is cached, as over gRPC)."""
        try:
            self.core.gate.open_network(caller, repo_id, what, "hub-api")
        except (FetchNotAllowed, RateLimited) as exc:
            return exc
        return None

    def commit(self, repo_id: str, revision: str, caller: Caller) -> str:
        """The commit a revision names now (the resolver's TTL cache; stale on an outage)."""
        self.check(repo_id, revision)
        spec = KernelSpec(repo_id, revision=revision)
        acquire = self.core.acquire
        refusal = None
        if not acquire.answers_locally(spec):
            refusal = self._open_network(caller, repo_id, f"repo={repo_id} ref={spec.ref}")
        try:
            commit, _ = acquire.commit_of(
                spec, allow_network=not acquire.answers_locally(spec) and refusal is None
            )
        except FetchNotAllowed:
            if refusal is not None:
                raise refusal from None
            raise
        return commit

    # -- listings -------------------------------------------------------------------------------

    def files(self, repo_id: str, commit: str, caller: Caller) -> list[HubFile]:
        """Every file of every variant of `commit` that is here or can be listed upstream,
        once its publisher is trusted (every route that hands out files lists them first).

        A complete listing (every variant) is remembered until the store changes: a job's
        `kernels` asks for it several times per kernel, and each answer would otherwise read
        every variant's manifest from the index."""
        generation = self.core.store.published.generation
        with self._lock:
            memo = self._complete.get((repo_id, commit))
        if memo is not None and memo[0] == generation:
            self._check_publisher(repo_id)
            self.signed(repo_id, commit, memo[1])
            return memo[1]
        allow = self.may_fetch(repo_id, caller)
        refusal = None
        if not self.core.acquire.lists_locally(repo_id, commit):
            what = f"repo={repo_id} commit={commit} listing"
            refusal = self._open_network(caller, repo_id, what)
            allow = refusal is None
        try:  # the resolver remembers a failed listing: an outage is not asked again at once
            listing = self.core.acquire.admitted(
                KernelSpec(repo_id, locked_commit=commit), allow_network=allow
            )
        except FetchNotAllowed:
            if refusal is not None:
                raise refusal from None
            raise
        except EntryNotFound as exc:
            raise NotAKernelRepo(
                "not a kernel repository (it has no build/ folder); kerneld's Hub API serves "
                "only kernels",
                repo_id=repo_id,
                revision=commit,
            ) from exc
        names = listing.names  # listed, so the repo exists: its publisher is trusted
        with self._lock:
            listed = self._listed.get((repo_id, commit), {})
        out: list[HubFile] = []
        failures: list[UpstreamError] = []
        complete = True
        recent = self._recent_failure((repo_id, commit))
        if recent is not None:
            failures.append(recent)
        for variant in names:
            stored = self.core.store.catalog.published_listing(repo_id, commit, variant)
            if stored is not None:
                out.extend(HubFile.published(variant, f) for f in stored)
                continue
            if variant not in listed and allow and recent is None:
                remote = self._list_upstream(repo_id, commit, variant, failures)
                if remote is not None:
                    listed = self._remember(repo_id, commit, variant, remote)
                elif failures:  # every upstream failed: the other variants would too
                    self._remember_failure((repo_id, commit), failures[-1])
                    recent = failures[-1]
            complete = complete and variant in listed
            out.extend(listed.get(variant, ()))
        if not out and failures:
            # Nothing of this commit is here and the upstreams cannot say what it holds: an
            # empty listing would read as "no files", so the outage is the answer. (With some
            # variants here, the listing shows those: a warm job keeps working.)
            raise every_upstream(failures, failures[0], repo_id=repo_id, revision=commit)
        out.sort(key=lambda f: f.path)
        self.signed(repo_id, commit, out)
        if complete:
            with self._lock:
                self._complete[(repo_id, commit)] = (generation, out)
                self._complete.move_to_end((repo_id, commit))
                while len(self._complete) > MAX_LISTED_COMMITS:
                    self._complete.popitem(last=False)
        return out

    def _list_upstream(
        self, repo_id: str, commit: str, variant: str, failures: list[UpstreamError]
    ) -> list[HubFile] | None:
        listed = self.core.acquire.upstream_files(repo_id, commit, variant, failures)
        return None if listed is None else [HubFile.remote(variant, f) for f in listed]

    def _remember(
        self, repo_id: str, commit: str, variant: str, files: list[HubFile]
    ) -> dict[str, list[HubFile]]:
        with self._lock:
            listed = dict(self._listed.get((repo_id, commit), {}))
            listed[variant] = files
            self._listed[(repo_id, commit)] = listed
            self._listed.move_to_end((repo_id, commit))
            while len(self._listed) > MAX_LISTED_COMMITS:
                self._listed.popitem(last=False)
            return listed

    # -- content --------------------------------------------------------------------------------

    @contextmanager
    def open(self, repo_id: str, commit: str, file: HubFile, caller: Caller) -> Iterator[BinaryIO]:
        """The file's bytes from the store, fetching its variant first when it is not here.
        The open descriptor keeps the bytes readable even if GC removes the tree meanwhile."""
        variant = file.variant
        for _ in range(2):
            tree = self._tree(repo_id, commit, variant, caller)
            rel = file.path.split("/", 2)[2]
            try:
                fh = open(tree / rel, "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                continue  # collected between the lookup and the open: look again
            try:
                yield fh
            finally:
                fh.close()
            return
        raise ResourceExhaustedError(
            file.size,
            0,
            "store cap (the tree was collected right after its fetch to make room for others)",
            repo_id=repo_id,
            commit=commit,
            variant=variant,
        )

    def _tree(self, repo_id: str, commit: str, variant: str, caller: Caller) -> Path:
        """The variant's tree, fetched first when it is not here (the acquire path, a `Named`
        plan: the listing and the publisher were admitted by `files`); the store hands it out
        only past its provenance gate."""
        core = self.core
        core.acquire.check_fields(repo_id, commit, variant)
        what = f"repo={repo_id} commit={commit} variant={variant}"
        got = core.acquire.acquire(
            KernelSpec(repo_id, locked_commit=commit),
            Named(variant, core.store.catalog.published_files),
            before_fetch=lambda: core.gate.open_network(caller, repo_id, what, "hub-api"),
        )
        return got.found[0]
