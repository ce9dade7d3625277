"""What a deny row refuses, and how an admin's `org/name@REV` becomes one.

A row says what it is by the form of its revision, so rows an older kerneld wrote keep working
without a migration (that kerneld stored the revision as typed):

- `*` (kind "repo"): every revision of the repo;
- a full commit ("commit"): that commit, however a request names it (a branch, a tag, the sha);
  what `kerneldctl deny org/name@REF` stores after resolving the ref or prefix it was given;
- a ref name ("ref", `kerneldctl deny --ref`): requests that name the ref, whatever commit it
  points to now or later (the commit itself stays loadable by another name: deny the commit
  for that); what an older kerneld's `deny org/name@v1` meant too;
- 7 to 39 hex digits ("prefix"): only an older kerneld wrote these; every commit they abbreviate.

Repo ids match in any case (`vocabulary.repo_key`): the Hub resolves `Org/Name` to `org/name`.
One rule for the daemon, the warm path and the `hub` fallback: `published_index.deny_covers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kerneld_client.published_index import ALL, deny_covers
from kerneld_client.vocabulary import MIN_COMMIT_PREFIX, is_commit, is_commit_prefix, repo_key

from .errors import UnresolvedDenyError
from .paths import validate_ref, validate_repo
from .types import DenyRow, RefRow, VariantRow

REPO, COMMIT, REF, PREFIX = "repo", "commit", "ref", "prefix"
KINDS = (REPO, COMMIT, REF, PREFIX)

#: Commits an ambiguous prefix's refusal names at most.
_SHOWN = 5

Lookup = Callable[[str], list[str]]
"""A question to the store: the commits a prefix or a ref names (any spelling of the repo)."""
AskUpstream = Callable[[str], str | None]
"""The daemon's resolver: the commit a ref or prefix names upstream now, or None."""


class _Names(Protocol):
    def repos(self) -> list[str]: ...

    def refs_of(self, repo: str) -> list[RefRow]: ...

    def denies(self, repo: str | None = None) -> list[DenyRow]: ...


class _Variants(Protocol):
    def variants_of(self, repo: str, commit: str | None = None) -> list[VariantRow]: ...


class NamesView(Protocol):
    """The store's reads a deny is planned and explained with: its names (refs, denies) and
    the commits it holds trees of (``store.names``, ``store.catalog``)."""

    @property
    def names(self) -> _Names: ...

    @property
    def catalog(self) -> _Variants: ...


def spellings(store: NamesView, repo: str) -> list[str]:
    """Every repo of the store that is `repo` in some case."""
    key = repo_key(repo)
    return [r for r in store.names.repos() if repo_key(r) == key]


def ref_commits(store: NamesView, repo: str, ref: str) -> list[str]:
    """Where `ref` points for `repo` in any spelling (one commit, unless the spellings were
    resolved at different times)."""
    found = {
        r.commit for s in spellings(store, repo) for r in store.names.refs_of(s) if r.ref == ref
    }
    return sorted(found)


def known_commits(store: NamesView, repo: str, prefix: str) -> list[str]:
    """The commits of `repo` (any spelling) the store has a tree or a ref of, that start with
    `prefix`."""
    found: set[str] = set()
    for s in spellings(store, repo):
        found.update(v.commit for v in store.catalog.variants_of(s))
        found.update(r.commit for r in store.names.refs_of(s))
    return sorted(c for c in found if c.startswith(prefix))


def deny_kind(revision: str) -> str:
    """The kind of a stored deny row (see the module docstring)."""
    if revision == ALL:
        return REPO
    if is_commit(revision):
        return COMMIT
    if is_commit_prefix(revision):
        return PREFIX
    return REF


def refuses(denied: str, revision: str, commit: str | None) -> bool:
    """Does a row of revision `denied` refuse a request for `revision` that names `commit`
    (None: not resolved yet)? The client's rule (`deny_covers`), one definition."""
    return deny_covers(denied, revision, commit)


def meaning(revision: str, points_to: list[str]) -> str:
    """What a row refuses, in words (`kerneldctl deny --list`); `points_to`: a ref's commits."""
    kind = deny_kind(revision)
    if kind == REPO:
        return "the whole repo: every revision"
    if kind == COMMIT:
        return f"commit {revision}, through any branch, tag or the sha"
    if kind == PREFIX:
        return f"every commit starting with {revision} (a prefix an older kerneld stored)"
    now = f"now {', '.join(points_to)}" if points_to else "not resolved on this host yet"
    return (
        f"the ref {revision}: requests that name it, whatever it points to ({now}; that "
        "commit stays loadable by another name)"
    )


@dataclass(frozen=True)
class DenyTarget:
    """The row a deny writes: `revision` as stored, its `kind`, and what it was resolved from
    (`asked`: the ref or prefix the admin typed; empty when stored as typed)."""

    repo: str
    revision: str
    kind: str
    asked: str = ""

    def label(self) -> str:
        """`org/x@<sha> (v1 -> <sha>)`: what the command says it denied."""
        if self.kind == REPO:
            return self.repo
        target = f"{self.repo}@{self.revision}"
        if self.asked:
            return f"{target} ({self.asked} -> {self.revision})"
        if self.kind == REF:
            return f"{target} (the ref name: whatever it points to, now and later)"
        return target


def plan_deny(
    store: NamesView,
    repo: str,
    revision: str,
    *,
    ref: bool = False,
    ask_upstream: AskUpstream | None = None,
) -> DenyTarget:
    """The row `deny repo@revision` writes. A full commit is kept; a ref or a commit prefix is
    resolved to its full commit now (the upstream through `ask_upstream` where the daemon can
    ask, else what the store knows), and UnresolvedDenyError says why when it cannot be. `ref`
    (`--ref`) keeps a ref name as a ref deny instead."""
    validate_repo(repo)
    if revision in ("", ALL):
        if ref:
            raise UnresolvedDenyError(
                "--ref needs a ref to deny: org/name@REF (without @REF the whole repo is denied)",
                repo_id=repo,
            )
        return DenyTarget(repo, ALL, REPO)
    validate_ref(revision, repo_id=repo)
    if ref:
        if is_commit(revision) or is_commit_prefix(revision):
            raise UnresolvedDenyError(
                f"{revision} reads as a commit, not a ref name: deny it without --ref (a "
                "commit prefix is resolved to its full commit)",
                repo_id=repo,
            )
        return DenyTarget(repo, revision, REF)
    if is_commit(revision):
        return DenyTarget(repo, revision, COMMIT)
    if is_commit_prefix(revision):
        found = known_commits(store, repo, revision)
        return _resolve_prefix(repo, revision, found, ask_upstream)
    return _resolve_ref(repo, revision, lambda r: ref_commits(store, repo, r), ask_upstream)


def plan_allow(
    store: NamesView,
    repo: str,
    revision: str,
    *,
    ref: bool = False,
    ask_upstream: AskUpstream | None = None,
) -> DenyTarget:
    """The row `allow repo@revision` lifts: the row stored under exactly `revision` (any
    kind, rows of an older kerneld included), else the one denied commit the prefix
    abbreviates, else the row `deny` of the same words would write (`plan_deny`)."""
    revision = revision or ALL
    stored = [d.revision for d in store.names.denies(repo)]
    if revision in stored or ref:
        return DenyTarget(repo, revision, deny_kind(revision))
    if is_commit_prefix(revision):
        denied = [r for r in stored if deny_kind(r) == COMMIT and r.startswith(revision)]
        if len(denied) == 1:
            return DenyTarget(repo, denied[0], COMMIT, asked=revision)
    return plan_deny(store, repo, revision, ask_upstream=ask_upstream)


def _resolve_prefix(
    repo: str, prefix: str, commits: list[str], ask_upstream: AskUpstream | None
) -> DenyTarget:
    if len(commits) > 1:
        shown = ", ".join(commits[:_SHOWN]) + (", ..." if len(commits) > _SHOWN else "")
        raise UnresolvedDenyError(
            f"commit prefix {prefix} is ambiguous: {len(commits)} commits of {repo} start with "
            f"it ({shown}); give more hex digits or the full commit",
            repo_id=repo,
        )
    if commits:
        return DenyTarget(repo, commits[0], COMMIT, asked=prefix)
    answer = ask_upstream(prefix) if ask_upstream is not None else None
    if answer is not None and answer.startswith(prefix):
        return DenyTarget(repo, answer, COMMIT, asked=prefix)
    where = (
        "this host and its upstreams know"
        if ask_upstream is not None
        else "this store knows (without the daemon only the store is asked)"
    )
    raise UnresolvedDenyError(
        f"no commit of {repo} that {where} starts with {prefix}; give the full 40-hex commit",
        repo_id=repo,
    )


def _resolve_ref(
    repo: str, name: str, ref_commits: Lookup, ask_upstream: AskUpstream | None
) -> DenyTarget:
    answer = ask_upstream(name) if ask_upstream is not None else None
    if answer is not None:
        return DenyTarget(repo, answer, COMMIT, asked=name)
    commits = ref_commits(name)
    if len(commits) == 1:
        return DenyTarget(repo, commits[0], COMMIT, asked=name)
    short = (
        f"; a commit prefix needs at least {MIN_COMMIT_PREFIX} hex digits"
        if name and not name.strip("0123456789abcdef")
        else ""
    )
    if commits:
        why = f"{name} points to {len(commits)} commits in this store ({', '.join(commits)})"
    elif ask_upstream is not None:
        why = f"neither the upstreams nor this store know where {name} points{short}"
    else:
        why = (
            f"this store does not know where {name} points (without the daemon only the store "
            f"is asked){short}"
        )
    raise UnresolvedDenyError(
        f"cannot resolve {repo}@{name} to a commit: {why}; deny the full commit, or "
        f"`kerneldctl deny --ref {repo}@{name}` to refuse the ref name itself",
        repo_id=repo,
    )
