"""What the store remembers about names rather than bytes: where refs point, what the upstream
lists (its versions, each commit's variants), failed upstream lookups (the negative cache),
pins and denies (what a deny row refuses: `deny_rules`). Every change a client resolves by is
republished in the published index.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from kerneld_client.vocabulary import is_commit

from .deny_rules import PREFIX, deny_kind, refuses
from .errors import DeniedError, InvalidInputError, UnresolvedDenyError, log_context
from .paths import validate_commit, validate_ref, validate_repo, validate_variant
from .published_index_writer import PublishedIndexWriter
from .state import StoreState
from .types import ALL, DenyRow, NegativeRow, PinRow, RefRow

log = logging.getLogger("kerneld.store")


class Names:
    """Refs, upstream facts, the negative cache, pins and denies (`interfaces.Policy`)."""

    def __init__(self, state: StoreState, writer: PublishedIndexWriter) -> None:
        self._state = state
        self._writer = writer

    # ---- refs and upstream facts ----

    def resolve_revision(self, repo: str, revision: str) -> str | None:
        """A ref known to the index -> its commit; a 40-hex revision -> itself; else None."""
        ref = self._state.index.get_ref(repo, revision)
        if ref is not None:
            return ref.commit
        if is_commit(revision):
            return revision
        return None

    def set_ref(
        self,
        repo: str,
        ref: str,
        commit: str,
        *,
        fetched_at: float | None = None,
        versions: Iterable[int] | None = None,
    ) -> None:
        """Record where `ref` points; `versions` is every `vN` the same upstream listing had
        (published so clients can say, as `kernels` does, that a newer version exists)."""
        state, index = self._state, self._state.index
        state.writable()
        validate_repo(repo)
        validate_ref(ref, repo_id=repo)
        validate_commit(commit, repo_id=repo)
        listed = None if versions is None else [int(v) for v in versions]
        if listed is not None and any(v < 0 for v in listed):
            raise InvalidInputError(f"versions must be non-negative, got {listed}", repo_id=repo)
        with state.lock:
            with index.tx() as conn:
                index.put_ref(conn, repo, ref, commit, fetched_at or time.time())
                if listed is not None:
                    index.put_upstream_versions(conn, repo, listed)
            self._writer.publish([repo])
        log.info("ref %s -> %s %s", ref, commit, log_context({"repo_id": repo}))

    def get_ref(self, repo: str, ref: str) -> RefRow | None:
        """The recorded ref with its fetch time (for TTL and serve-stale decisions)."""
        return self._state.index.get_ref(repo, ref)

    def refs_of(self, repo: str) -> list[RefRow]:
        """Every ref of `repo` this store has recorded (what it can answer without upstreams)."""
        return self._state.index.refs_of(repo)

    def all_refs(self) -> list[RefRow]:
        return self._state.index.all_refs()

    def repos(self) -> list[str]:
        """Every repo with a variant, a ref or a deny in the store."""
        return self._state.index.repos()

    def upstream_versions(self, repo: str) -> list[int] | None:
        """Every `vN` of the last upstream refs listing recorded with `set_ref`, or None."""
        return self._state.index.upstream_versions(repo)

    def upstream_variants(self, repo: str, commit: str) -> list[str] | None:
        """Every variant the upstream listed for this commit, or None if never recorded."""
        return self._state.index.get_upstream_variants(repo, commit)

    def set_upstream_variants(self, repo: str, commit: str, names: Iterable[str]) -> None:
        """Record every variant the upstream has for this commit (published in the client
        index, so a client knows whether a better variant than the cached ones exists)."""
        state, index = self._state, self._state.index
        state.writable()
        validate_repo(repo)
        validate_commit(commit, repo_id=repo)
        clean = sorted({validate_variant(n, repo_id=repo, commit=commit) for n in names})
        with state.lock:
            with index.tx() as conn:
                index.put_upstream_variants(conn, repo, commit, clean)
            self._writer.publish([repo])

    # ---- the negative cache ----

    def put_negative(
        self, repo: str, revision: str, variant: str, reason: str, ttl_s: float
    ) -> None:
        """Remember a failed lookup upstream (no such repo/revision/variant) for ``ttl_s``."""
        state = self._state
        state.writable()
        now = time.time()
        row = NegativeRow(repo, revision, variant or ALL, reason[:1024], now, now + ttl_s)
        with state.lock, state.index.tx() as conn:
            state.index.put_negative(conn, row)

    def get_negative(self, repo: str, revision: str, variant: str = ALL) -> NegativeRow | None:
        """The unexpired failed lookup of (repo, revision, variant), if one is remembered."""
        row = self._state.index.get_negative(repo, revision, variant or ALL)
        if row is None or row.expires_at <= time.time():
            return None
        return row

    # ---- pins and denies ----

    def pin(self, repo: str, revision: str = ALL, variant: str = ALL) -> None:
        """Make trees of ``repo`` (``revision`` ref/commit or all, ``variant`` or all) GC roots."""
        state = self._state
        state.writable()
        validate_repo(repo)
        if revision != ALL:
            validate_ref(revision, repo_id=repo)
        if variant != ALL:
            validate_variant(variant, repo_id=repo)
        with state.lock, state.index.tx() as conn:
            state.index.put_pin(conn, repo, revision, variant)
        log.info("pinned %s@%s/%s", repo, revision, variant)

    def unpin(self, repo: str, revision: str = ALL, variant: str = ALL) -> bool:
        state = self._state
        state.writable()
        with state.lock, state.index.tx() as conn:
            removed = state.index.delete_pin(conn, repo, revision, variant)
        log.info("unpinned %s@%s/%s (%s)", repo, revision, variant, removed)
        return removed

    def pins(self) -> list[PinRow]:
        return self._state.index.pins()

    def deny(self, repo: str, revision: str = ALL, reason: str = "") -> None:
        """Refuse ``repo`` (every spelling), a commit of it, or a ref name of it, from now on;
        published to clients. A commit prefix is refused: resolve it first
        (`deny_rules.plan_deny`)."""
        state, index = self._state, self._state.index
        state.writable()
        validate_repo(repo)
        if revision != ALL:
            validate_ref(revision, repo_id=repo)
            if deny_kind(revision) == PREFIX:
                raise UnresolvedDenyError(
                    f"{revision} is a commit prefix: deny the full commit it abbreviates "
                    "(`kerneldctl deny` resolves it)",
                    repo_id=repo,
                )
        with state.lock:
            with index.tx() as conn:
                index.put_deny(conn, repo, revision, reason)
            self._writer.publish(index.spellings(repo), denies=True)
        log.info("denied %s@%s (%s): %s", repo, revision, deny_kind(revision), reason)

    def allow(self, repo: str, revision: str = ALL) -> bool:
        """Lift the deny row of ``repo`` (any spelling) and ``revision`` as stored."""
        state, index = self._state, self._state.index
        state.writable()
        with state.lock:
            with index.tx() as conn:
                removed = index.delete_deny(conn, repo, revision)
            self._writer.publish(index.spellings(repo), denies=True)
        log.info("allowed %s@%s (%s)", repo, revision, removed)
        return removed

    def denies(self, repo: str | None = None) -> list[DenyRow]:
        """Every deny row, or those of ``repo`` in any spelling."""
        return self._state.index.denies(repo)

    def check_denied(
        self,
        repo: str,
        revision: str,
        commit: str | None = None,
        ctx: dict[str, str | None] | None = None,
    ) -> None:
        """Raise :class:`DeniedError` if a deny of ``repo`` (in any spelling) refuses this
        revision or commit (`deny_rules.refuses`); the error carries ``ctx`` (default: the
        repo and commit)."""
        if ctx is None:
            ctx = {"repo_id": repo, "commit": commit}
        for d in self._state.index.denies(repo):
            if refuses(d.revision, revision, commit):
                raise DeniedError(d.reason, **{k: v for k, v in ctx.items() if v is not None})
