"""The daemon's published index: its format, and the reader the warm path uses.

This is the warm path's only source of truth: the daemon publishes small JSON documents
(`<store>/index/v1/<org>/<name>.json`, written by `kerneld.store.published_index`) and a
process maps (repo, ref, platform) to a tree by reading one of them, without SQLite, gRPC or
network. The daemon's store imports the constants from here (kerneld may import kerneld_client,
never the reverse), so the format has one definition. (The store's own SQLite index is another
thing: only the daemon reads it.) The tree-lock protocol is in `file_locks`.

Standard library only: this module is on the warm path.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kerneld_client.vocabulary import is_commit, is_commit_prefix, is_hex, repo_key

__all__ = [
    "ALL",
    "DENIES_FILE",
    "DENIES_FORMAT",
    "FORMAT",
    "PUBLISHERS_FILE",
    "PUBLISHERS_FORMAT",
    "VERSION",
    "CommitEntry",
    "IndexFormatError",
    "Publishers",
    "RepoIndex",
    "VariantEntry",
    "deny_covers",
    "index_dir",
    "lock_path_for",
    "parse_repo_doc",
    "read_denies",
    "read_publishers",
    "read_repo_index",
    "repo_index_path",
    "tree_relpath_for",
]

FORMAT = "kerneld-client-index"
DENIES_FORMAT = "kerneld-denies"
VERSION = 1
#: A deny whose revision is this applies to every revision of the repo.
ALL = "*"
DENIES_FILE = "denies.json"
#: Index documents are small; a larger one is not ours.
MAX_INDEX_BYTES = 16 << 20

_HEX = "0123456789abcdef"


def _digest_hex(digest: str) -> str | None:
    """The hex of a tree digest `sha256:<64 hex>`, or None."""
    return digest[7:] if digest.startswith("sha256:") and is_hex(digest[7:], 64) else None


PROVENANCE_KEYS = ("status", "signer", "issuer")


class IndexFormatError(ValueError):
    """An index document exists but is malformed (treated as a miss by the client)."""


class Provenance:
    """Who signed a tree, as the daemon checked it when the tree entered the store
    (`[provenance]`): `status` is "verified", "unsigned", "invalid" or "unchecked"; `signer`
    (an email or a CI workflow URI) and `issuer` (its OIDC issuer) are set when verified."""

    __slots__ = ("issuer", "signer", "status")

    def __init__(self, status: str, signer: str = "", issuer: str = "") -> None:
        self.status = status
        self.signer = signer
        self.issuer = issuer

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Provenance):
            return NotImplemented
        return (self.status, self.signer, self.issuer) == (other.status, other.signer, other.issuer)

    def __hash__(self) -> int:
        return hash((self.status, self.signer, self.issuer))

    def __str__(self) -> str:
        if self.verified:
            return f"verified: signed by {self.signer} (issuer {self.issuer})"
        return self.status

    def __repr__(self) -> str:
        return f"Provenance({self.status!r}, signer={self.signer!r}, issuer={self.issuer!r})"


class VariantEntry:
    """One published variant tree of a commit; paths are relative to the store root.

    Plain slotted classes, not dataclasses, here and below: this module is imported on every
    warm load and a frozen dataclass costs about a millisecond to define.
    """

    __slots__ = ("archs", "backend", "digest", "lock", "metadata_id", "name", "provenance", "tree")

    def __init__(
        self,
        name: str,
        tree: str,
        digest: str,
        lock: str,
        metadata_id: str | None,
        backend: str | None,
        archs: tuple[str, ...],
        provenance: Provenance | None = None,
    ) -> None:
        self.name = name
        self.tree = tree
        self.digest = digest
        self.lock = lock
        self.metadata_id = metadata_id
        self.backend = backend
        self.archs = archs
        self.provenance = provenance  # None: the daemon recorded none (it checks no signatures)

    def __repr__(self) -> str:
        return f"VariantEntry({self.name!r}, tree={self.tree!r}, digest={self.digest!r})"


class CommitEntry:
    """What the store holds for one commit, every variant the upstream has (None: unknown),
    and per platform fingerprint the variant that platform loads (`picks`, None: none fits)."""

    __slots__ = ("picks", "upstream_variants", "variants")

    def __init__(
        self,
        variants: Mapping[str, VariantEntry],
        upstream_variants: tuple[str, ...] | None,
        picks: Mapping[str, str | None] | None = None,
    ) -> None:
        self.variants = variants
        self.upstream_variants = upstream_variants
        self.picks: Mapping[str, str | None] = picks or {}


class RepoIndex:
    """One parsed per-repo document."""

    __slots__ = ("commits", "denies", "generation", "refs", "repo", "versions")

    def __init__(
        self,
        repo: str,
        generation: int,
        refs: Mapping[str, tuple[str, float]],
        commits: Mapping[str, CommitEntry],
        denies: tuple[tuple[str, str], ...],
        versions: tuple[int, ...] | None = None,
    ) -> None:
        self.repo = repo
        self.generation = generation
        self.refs = refs  # ref -> (commit, fetched_at)
        self.commits = commits
        self.denies = denies  # (revision or "*", reason)
        self.versions = versions  # every vN the upstream listed last time; None: never listed

    def commit_for(self, revision: str) -> str | None:
        """A ref known to the index -> its commit; a 40-hex revision -> itself; else None."""
        ref = self.refs.get(revision)
        if ref is not None:
            return ref[0]
        return revision if is_commit(revision) else None

    def deny_reason(self, revision: str, commit: str | None) -> str | None:
        """The reason of the first deny covering this request, or None."""
        for rev, reason in self.denies:
            if deny_covers(rev, revision, commit):
                return reason or "denied by the administrator"
        return None


def deny_covers(denied: str, revision: str, commit: str | None) -> bool:
    """Does a published deny of revision `denied` refuse a request for `revision` that names
    `commit` (None: not known yet)? `*` is the whole repo; a full commit is that commit however
    it is asked for; a ref name refuses requests that name it (the daemon publishes the commit
    it points to as a row of its own); a commit prefix (a row an older kerneld stored as it was
    typed) refuses every commit it abbreviates."""
    if denied in (ALL, revision):
        return True
    if commit is None:
        return False
    return denied == commit or (is_commit_prefix(denied) and commit.startswith(denied))


#: The index's folder in the store (one `joinpath`: a warm load makes these paths).
INDEX_PARTS = ("index", f"v{VERSION}")


def index_dir(store_root: Path) -> Path:
    return store_root.joinpath(*INDEX_PARTS)


def repo_index_path(store_root: Path, repo: str) -> Path:
    org, _, name = repo.partition("/")
    return store_root.joinpath(*INDEX_PARTS, org, f"{name}.json")


def lock_path_for(store_root: Path, digest: str) -> Path:
    """The lock file of the tree with digest `sha256:<hex>` (the store's `locks/<hex>.lock`)."""
    hexd = _digest_hex(digest)
    if hexd is None:
        raise IndexFormatError(f"not a tree digest: {digest!r}")
    return store_root / "locks" / f"{hexd}.lock"


def tree_relpath_for(daemon_path: str | Path, digest: str) -> Path:
    """The store-relative path (`v1/trees/<hex>`) of the tree the daemon answered with.

    The daemon's absolute path is where *it* sees the store; a job in a container sees the same
    store elsewhere (a read-only bind mount at another path), so only the tail that names the
    tree is used, and it must be the tree of `digest`."""
    hexd = _digest_hex(digest)
    parts = Path(daemon_path).parts[-3:]
    if (
        hexd is None
        or len(parts) != 3
        or not (parts[0][:1] == "v" and parts[0][1:].isascii() and parts[0][1:].isdigit())
        or parts[1] != "trees"
        or parts[2] != hexd
    ):
        raise IndexFormatError(f"not the store path of tree {digest!r}: {str(daemon_path)!r}")
    tail = "/".join(parts)
    return Path(tail)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise IndexFormatError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _variant(name: str, raw: Any) -> VariantEntry:
    if not isinstance(raw, dict):
        raise IndexFormatError(f"variant {name!r} must be an object")
    archs = raw.get("archs") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise IndexFormatError(f"variant {name!r}: archs must be a list of strings")
    mid, backend = raw.get("metadata_id"), raw.get("backend")
    prov = raw.get("provenance")
    if prov is not None and not (
        isinstance(prov, dict) and all(isinstance(prov.get(k, ""), str) for k in PROVENANCE_KEYS)
    ):
        raise IndexFormatError(
            f"variant {name!r}: provenance must map {PROVENANCE_KEYS} to strings"
        )
    return VariantEntry(
        name=name,
        tree=_str(raw.get("tree"), "tree"),
        digest=_str(raw.get("digest"), "digest"),
        lock=_str(raw.get("lock"), "lock"),
        metadata_id=mid if isinstance(mid, str) else None,
        backend=backend if isinstance(backend, str) else None,
        archs=tuple(archs),
        provenance=None
        if prov is None
        else Provenance(*(prov.get(k, "") for k in PROVENANCE_KEYS)),
    )


def parse_repo_doc(data: bytes | str) -> RepoIndex | None:
    """Parse a per-repo document; None for another format or version (ask the daemon),
    IndexFormatError for a document of our format that does not hold together."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise IndexFormatError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return None
    try:
        refs = {
            _str(ref, "ref"): (_str(v["commit"], "commit"), float(v.get("fetched_at") or 0.0))
            for ref, v in (doc.get("refs") or {}).items()
        }
        commits: dict[str, CommitEntry] = {}
        for commit, entry in (doc.get("commits") or {}).items():
            upstream = entry.get("upstream_variants")
            if upstream is not None and (
                not isinstance(upstream, list) or not all(isinstance(u, str) for u in upstream)
            ):
                raise IndexFormatError(f"commit {commit}: upstream_variants must be a list")
            picks = entry.get("picks") or {}
            if not isinstance(picks, dict) or not all(
                isinstance(p, str) or p is None for p in picks.values()
            ):
                raise IndexFormatError(f"commit {commit}: picks must map to variant names or null")
            commits[commit] = CommitEntry(
                variants={n: _variant(n, v) for n, v in (entry.get("variants") or {}).items()},
                upstream_variants=None if upstream is None else tuple(upstream),
                picks=picks,
            )
        denies = tuple(
            (_str(d["revision"], "deny revision"), str(d.get("reason") or ""))
            for d in doc.get("denies") or []
        )
        versions = doc.get("versions")
        if versions is not None and (
            not isinstance(versions, list) or not all(type(v) is int and v >= 0 for v in versions)
        ):
            raise IndexFormatError("versions must be a list of non-negative integers")
        return RepoIndex(
            repo=_str(doc.get("repo"), "repo"),
            generation=int(doc.get("generation") or 0),
            refs=refs,
            commits=commits,
            denies=denies,
            versions=None if versions is None else tuple(versions),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, IndexFormatError):
            raise
        raise IndexFormatError(f"malformed index document: {exc!r}") from exc


def _read_trusted(path: Path, owner_uid: int | None) -> bytes | None:
    """Read a published index file; None if absent. With `owner_uid`, a file that is not owned by
    the store owner or is writable by others is refused (PermissionError): anyone able to
    rewrite it could point a process at a tree of their choosing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise PermissionError(f"{path} is a symlink; the index is never linked") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path} is not a regular file")
        if owner_uid is not None and st.st_uid != owner_uid:
            raise PermissionError(
                f"{path} is owned by uid {st.st_uid}, not by the store owner {owner_uid}"
            )
        if st.st_mode & 0o022:
            raise PermissionError(f"{path} is writable by others (mode {st.st_mode & 0o7777:o})")
        if st.st_size > MAX_INDEX_BYTES:
            raise IndexFormatError(f"{path} is {st.st_size} bytes, too large for an index file")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_repo_index(store_root: Path, repo: str, *, owner_uid: int | None) -> RepoIndex | None:
    """The published document of `repo`, or None (no such file / foreign format: a miss).

    Raises PermissionError for an untrusted file and IndexFormatError for a malformed one.
    """
    data = _read_trusted(repo_index_path(store_root, repo), owner_uid)
    if data is None:
        return None
    doc = parse_repo_doc(data)
    if doc is not None and doc.repo != repo:
        raise IndexFormatError(f"index file of {repo} describes {doc.repo}")
    return doc


def read_denies(store_root: Path, *, owner_uid: int | None) -> list[tuple[str, str, str]]:
    """Every deny of the store as (repo, revision, reason); empty when there is no file."""
    data = _read_trusted(index_dir(store_root) / DENIES_FILE, owner_uid)
    if data is None:
        return []
    try:
        doc = json.loads(data)
        if doc.get("format") != DENIES_FORMAT or doc.get("version") != VERSION:
            return []
        return [
            (str(d["repo"]), str(d["revision"]), str(d.get("reason") or ""))
            for d in doc.get("denies") or []
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IndexFormatError(f"malformed {DENIES_FILE}: {exc!r}") from exc


def repo_matches(repo: str, pattern: str) -> bool:
    """`fnmatch.fnmatchcase(repo, pattern)`, without compiling a regular expression for the
    patterns sites write (`org/*`, `org-*/*`, an exact repo id): `fnmatch` compiles one per
    pattern and process, about 0.1 ms, which a warm load would pay. Patterns with `?` or `[`
    go to `fnmatch` itself. The daemon's `[trust]` and `[fetch]` lists match with it too.
    Case-insensitively, as the Hub resolves repo ids (`vocabulary.repo_key`)."""
    repo, pattern = repo_key(repo), repo_key(pattern)
    if "?" in pattern or "[" in pattern:
        from fnmatch import fnmatchcase

        return fnmatchcase(repo, pattern)
    first, *rest = pattern.split("*")
    if not rest:
        return repo == pattern
    last = rest.pop()
    if len(repo) < len(first) + len(last) or not (repo.startswith(first) and repo.endswith(last)):
        return False
    pos, end = len(first), len(repo) - len(last)
    for part in rest:  # each between two stars: its leftmost place is as good as any
        found = repo.find(part, pos, end)
        if found < 0:
            return False
        pos = found + len(part)
    return True


PUBLISHERS_FORMAT = "kerneld-publishers"
PUBLISHERS_FILE = "publishers.json"


class Publishers:
    """The daemon's `[trust]` policy and the Hub's answers (kerneld/pipeline/publisher_trust.py)."""

    __slots__ = ("allow", "honor_trust_remote_code", "policy", "trusted_orgs")

    def __init__(
        self,
        policy: str,
        allow: tuple[str, ...],
        honor_trust_remote_code: bool,
        trusted_orgs: frozenset[str],
    ) -> None:
        self.policy = policy
        self.allow = allow
        self.honor_trust_remote_code = honor_trust_remote_code
        self.trusted_orgs = trusted_orgs

    def trusts(self, repo: str, *, trust_remote_code: bool) -> bool:
        """May this process run `repo`'s code without asking the daemon? (False: ask it.)"""
        if self.policy == "any" or (trust_remote_code and self.honor_trust_remote_code):
            return True
        names = (repo_key(repo.split("/", 1)[0]), repo_key(repo))  # org/name: a mirror import's
        if self.policy == "hub" and any(n in self.trusted_orgs for n in names):
            return True
        return any(repo_matches(repo, p) for p in self.allow)


def read_publishers(store_root: Path, *, owner_uid: int | None) -> Publishers | None:
    """The published trust policy; None when there is no file. A file of another format or
    version raises IndexFormatError (ask the daemon)."""
    data = _read_trusted(store_root.joinpath(*INDEX_PARTS, PUBLISHERS_FILE), owner_uid)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        if doc.get("format") != PUBLISHERS_FORMAT or doc.get("version") != VERSION:
            raise IndexFormatError(f"{PUBLISHERS_FILE} is not version {VERSION} of our format")
        allow = doc.get("allow") or []
        orgs = {**(doc.get("orgs") or {}), **(doc.get("repos") or {})}  # repos: mirror imports
        return Publishers(
            policy=_str(doc["policy"], "policy"),
            allow=tuple(_str(p, "allow pattern") for p in allow),
            honor_trust_remote_code=doc.get("honor_trust_remote_code") is True,
            trusted_orgs=frozenset(
                repo_key(o) for o, v in orgs.items() if v.get("trusted") is True
            ),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IndexFormatError(f"malformed {PUBLISHERS_FILE}: {exc!r}") from exc
