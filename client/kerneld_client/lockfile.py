"""`kernels.lock` files in both formats, and `[tool.kernels.dependencies]` of a pyproject.toml.

Two formats exist (REFERENCE.md section 3):

- **0.17** (what `kernels` 0.17 reads and writes): a JSON list of
  ``{"dependency": {"repo-id": "org/name", "version": 1 | "revision": "main"},
  "lock": {"commit": "<hex>"}}``. Unknown fields and duplicate dependencies are rejected, as
  `kernels` does. :func:`dumps_locks` writes it byte for byte as `kernels lock` does (sorted by
  repo id, versions before revisions, two-space indent, no trailing newline).
- **old** (`kernels` <= 0.16): a JSON list of ``{"repo_id", "sha", "variants": {<variant>:
  {"hash": "sha256-<hex>", "hash_type": "git_lfs_concat"}}}``. :func:`git_lfs_concat_hash`
  recomputes a variant's hash from its files' upstream ids, so such files can still be checked.

Every problem is a :class:`LockfileError` naming the file, the entry and what is wrong; nothing
else escapes the parsers, whatever the input (the tests fuzz them). Standard library only: the
client library imports this module too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "HASH_TYPE",
    "LOCKFILE_NAME",
    "Dependency",
    "Lock",
    "LockFile",
    "LockfileError",
    "OldLock",
    "VariantHash",
    "dumps_locks",
    "git_blob_sha1",
    "git_lfs_concat_hash",
    "load_lockfile",
    "parse_lockfile",
    "read_pyproject_dependencies",
    "variant_hash_inputs",
    "write_lockfile",
]

LOCKFILE_NAME = "kernels.lock"
HASH_TYPE = "git_lfs_concat"
#: `kernels` reads versions as a Rust usize.
MAX_VERSION = (1 << 64) - 1
#: Lock files are small; refuse to parse anything absurd.
MAX_LOCKFILE_BYTES = 64 << 20

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_OBJECT_ID = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
_VARIANT_HASH = re.compile(r"^sha256-[0-9a-f]{64}$")
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")


class LockfileError(ValueError):
    """A lock file or pyproject.toml that cannot be used; says where and why."""

    def __init__(
        self, message: str, *, source: str = LOCKFILE_NAME, entry: int | None = None, what: str = ""
    ) -> None:
        self.source = source
        self.entry = entry
        self.what = what
        self.problem = message
        where = source
        if entry is not None:
            where += f": entry {entry}"
            if what:
                where += f" ({what})"
        elif what:
            where += f": {what}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Dependency:
    """A kernel dependency: `org/name` at a version (branch `vN`) or a revision."""

    repo_id: str
    version: int | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        if (self.version is None) == (self.revision is None):
            raise ValueError("a dependency needs exactly one of version and revision")

    @property
    def ref(self) -> str:
        """The ref this dependency names: `vN` for a version (versions are branches)."""
        return f"v{self.version}" if self.version is not None else str(self.revision)

    def sort_key(self) -> tuple[str, int, int, str]:
        """The order `kernels` writes: repo id, then versions (numeric) before revisions."""
        if self.version is not None:
            return (self.repo_id, 0, self.version, "")
        return (self.repo_id, 1, 0, str(self.revision))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"repo-id": self.repo_id}
        if self.version is not None:
            doc["version"] = self.version
        else:
            doc["revision"] = self.revision
        return doc

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.repo_id}:{self.version}"
        return f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class Lock:
    """One entry of a 0.17 lock file: a dependency and the commit it is locked at."""

    dependency: Dependency
    commit: str
    """Lowercase hex (40, or 64 for sha256 repositories)."""


@dataclass(frozen=True)
class VariantHash:
    hash: str
    hash_type: str = HASH_TYPE


@dataclass(frozen=True)
class OldLock:
    """One entry of an old-format lock file."""

    repo_id: str
    sha: str
    variants: Mapping[str, VariantHash] = field(default_factory=dict)


@dataclass(frozen=True)
class LockFile:
    """A parsed lock file: `locks` (0.17 format) or `old` (old format); the other is empty."""

    format: Literal["0.17", "old"]
    locks: tuple[Lock, ...] = ()
    old: tuple[OldLock, ...] = ()
    source: str = LOCKFILE_NAME

    def pinned(self) -> list[tuple[str, str, str | None]]:
        """(repo id, commit, ref or None) for every entry, whatever the format."""
        if self.format == "0.17":
            return [(x.dependency.repo_id, x.commit, x.dependency.ref) for x in self.locks]
        return [(x.repo_id, x.sha, None) for x in self.old]


# ---- parsing --------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _load_json(data: str | bytes, source: str) -> Any:
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        if len(raw) > MAX_LOCKFILE_BYTES:
            raise LockfileError(f"file is over {MAX_LOCKFILE_BYTES} bytes", source=source)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LockfileError(f"not UTF-8 text: {exc}", source=source) from None
    elif isinstance(data, str):
        text = data
        if len(text) > MAX_LOCKFILE_BYTES:
            raise LockfileError(f"file is over {MAX_LOCKFILE_BYTES} bytes", source=source)
    else:
        raise LockfileError(f"expected text, got {type(data).__name__}", source=source)
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant
        )
    except _DuplicateKey as exc:
        raise LockfileError(f"duplicate key {exc.key!r} in a JSON object", source=source) from None
    except json.JSONDecodeError as exc:
        raise LockfileError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", source=source
        ) from None
    except (ValueError, RecursionError) as exc:
        raise LockfileError(f"not valid JSON: {exc}", source=source) from None


def _describe(value: Any) -> str:
    """A short rendering of an offending value for an error message (never raises)."""
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_keys(
    obj: Mapping[str, Any], allowed: Sequence[str], what: str, source: str, entry: int, name: str
) -> None:
    for key in obj:
        if key not in allowed:
            expected = ", ".join(f"`{k}`" for k in allowed)
            raise LockfileError(
                f"unknown field `{key}` in {what}, expected {expected}",
                source=source,
                entry=entry,
                what=name,
            )


def _repo_id(value: Any, key: str, source: str, entry: int) -> str:
    if not isinstance(value, str):
        raise LockfileError(
            f"`{key}` must be a string, got {_describe(value)}", source=source, entry=entry
        )
    if not _REPO_ID.match(value) or ".." in value:
        raise LockfileError(
            f"`{key}` must be a repo id 'org/name', got {_describe(value)}",
            source=source,
            entry=entry,
        )
    return value


def _parse_new_entry(raw: Any, source: str, entry: int) -> Lock:
    if not isinstance(raw, dict):
        raise LockfileError(
            f"expected an object with `dependency` and `lock`, got {_describe(raw)}",
            source=source,
            entry=entry,
        )
    dep_raw = raw.get("dependency")
    name = ""
    if isinstance(dep_raw, dict) and isinstance(dep_raw.get("repo-id"), str):
        name = dep_raw["repo-id"]
    _check_keys(raw, ("dependency", "lock"), "an entry", source, entry, name)
    for key in ("dependency", "lock"):
        if key not in raw:
            raise LockfileError(f"missing field `{key}`", source=source, entry=entry, what=name)
        if not isinstance(raw[key], dict):
            raise LockfileError(
                f"`{key}` must be an object, got {_describe(raw[key])}",
                source=source,
                entry=entry,
                what=name,
            )
    dep = raw["dependency"]
    _check_keys(dep, ("repo-id", "version", "revision"), "`dependency`", source, entry, name)
    if "repo-id" not in dep:
        raise LockfileError("missing field `dependency.repo-id`", source=source, entry=entry)
    repo_id = _repo_id(dep["repo-id"], "dependency.repo-id", source, entry)
    has_version, has_revision = "version" in dep, "revision" in dep
    if has_version and has_revision:
        raise LockfileError(
            "`version` and `revision` are mutually exclusive", source=source, entry=entry, what=name
        )
    if not has_version and not has_revision:
        raise LockfileError(
            "either `version` or `revision` must be specified",
            source=source,
            entry=entry,
            what=name,
        )
    if has_version:
        version = dep["version"]
        if isinstance(version, bool) or not isinstance(version, int):
            raise LockfileError(
                f"`version` must be a non-negative integer, got {_describe(version)}",
                source=source,
                entry=entry,
                what=name,
            )
        if not 0 <= version <= MAX_VERSION:
            raise LockfileError(
                f"`version` {version} is out of range", source=source, entry=entry, what=name
            )
        dependency = Dependency(repo_id, version=version)
    else:
        revision = dep["revision"]
        if not isinstance(revision, str) or not revision:
            raise LockfileError(
                f"`revision` must be a non-empty string, got {_describe(revision)}",
                source=source,
                entry=entry,
                what=name,
            )
        dependency = Dependency(repo_id, revision=revision)
    lock = raw["lock"]
    _check_keys(lock, ("commit",), "`lock`", source, entry, name)
    commit = lock.get("commit")
    if "commit" not in lock:
        raise LockfileError("missing field `lock.commit`", source=source, entry=entry, what=name)
    if not isinstance(commit, str) or not _OBJECT_ID.match(commit):
        raise LockfileError(
            f"`lock.commit` must be a full git object id (40 or 64 hex digits), "
            f"got {_describe(commit)}",
            source=source,
            entry=entry,
            what=name,
        )
    return Lock(dependency, commit.lower())


def _parse_old_entry(raw: Any, source: str, entry: int) -> OldLock:
    if not isinstance(raw, dict):
        raise LockfileError(
            f"expected an object with `repo_id`, `sha` and `variants`, got {_describe(raw)}",
            source=source,
            entry=entry,
        )
    name = raw["repo_id"] if isinstance(raw.get("repo_id"), str) else ""
    _check_keys(raw, ("repo_id", "sha", "variants"), "an entry", source, entry, name)
    for key in ("repo_id", "sha", "variants"):
        if key not in raw:
            raise LockfileError(f"missing field `{key}`", source=source, entry=entry, what=name)
    repo_id = _repo_id(raw["repo_id"], "repo_id", source, entry)
    sha = raw["sha"]
    if not isinstance(sha, str) or not _COMMIT.match(sha):
        raise LockfileError(
            f"`sha` must be a 40-hex commit, got {_describe(sha)}",
            source=source,
            entry=entry,
            what=name,
        )
    variants_raw = raw["variants"]
    if not isinstance(variants_raw, dict):
        raise LockfileError(
            f"`variants` must be an object, got {_describe(variants_raw)}",
            source=source,
            entry=entry,
            what=name,
        )
    variants: dict[str, VariantHash] = {}
    for variant, body in variants_raw.items():
        if not _VARIANT_NAME.match(variant):
            raise LockfileError(
                f"bad variant name {_describe(variant)}", source=source, entry=entry, what=name
            )
        if not isinstance(body, dict):
            raise LockfileError(
                f"variant {variant}: expected an object with `hash`, got {_describe(body)}",
                source=source,
                entry=entry,
                what=name,
            )
        _check_keys(body, ("hash", "hash_type"), f"variant {variant}", source, entry, name)
        hash_type = body.get("hash_type", HASH_TYPE)
        if hash_type != HASH_TYPE:
            raise LockfileError(
                f"variant {variant}: unsupported hash_type {_describe(hash_type)} "
                f"(only {HASH_TYPE!r} exists)",
                source=source,
                entry=entry,
                what=name,
            )
        value = body.get("hash")
        if not isinstance(value, str) or not _VARIANT_HASH.match(value):
            raise LockfileError(
                f"variant {variant}: `hash` must be 'sha256-<64 lowercase hex>', "
                f"got {_describe(value)}",
                source=source,
                entry=entry,
                what=name,
            )
        variants[variant] = VariantHash(value, HASH_TYPE)
    return OldLock(repo_id, sha.lower(), variants)


def parse_lockfile(data: str | bytes, *, source: str = LOCKFILE_NAME) -> LockFile:
    """Parse a lock file of either format; `source` names it in errors."""
    doc = _load_json(data, source)
    if not isinstance(doc, list):
        raise LockfileError(
            f"expected a JSON list of locked kernels, got {type(doc).__name__}", source=source
        )
    if not doc:
        return LockFile("0.17", source=source)
    first = doc[0]
    old = isinstance(first, dict) and "repo_id" in first and "dependency" not in first
    if old:
        olds: list[OldLock] = []
        seen_repos: dict[str, int] = {}
        for i, raw in enumerate(doc):
            if isinstance(raw, dict) and "dependency" in raw:
                raise LockfileError(
                    "mixes the 0.17 format into an old-format lock file", source=source, entry=i
                )
            item = _parse_old_entry(raw, source, i)
            if item.repo_id in seen_repos:
                raise LockfileError(
                    f"duplicate kernel (also entry {seen_repos[item.repo_id]})",
                    source=source,
                    entry=i,
                    what=item.repo_id,
                )
            seen_repos[item.repo_id] = i
            olds.append(item)
        return LockFile("old", old=tuple(olds), source=source)
    locks: list[Lock] = []
    seen: dict[Dependency, int] = {}
    for i, raw in enumerate(doc):
        if isinstance(raw, dict) and "repo_id" in raw and "dependency" not in raw:
            raise LockfileError(
                "mixes the old format into a 0.17 lock file", source=source, entry=i
            )
        lock = _parse_new_entry(raw, source, i)
        if lock.dependency in seen:
            raise LockfileError(
                f"duplicate dependency (also entry {seen[lock.dependency]})",
                source=source,
                entry=i,
                what=str(lock.dependency),
            )
        seen[lock.dependency] = i
        locks.append(lock)
    return LockFile("0.17", locks=tuple(locks), source=source)


def load_lockfile(path: str | os.PathLike[str]) -> LockFile:
    """Read and parse a lock file; unreadable files are a LockfileError too."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_LOCKFILE_BYTES + 1)
    except OSError as exc:
        raise LockfileError(f"cannot read: {exc.strerror or exc}", source=str(p)) from None
    return parse_lockfile(data, source=str(p))


# ---- writing (0.17 format) ------------------------------------------------------------------


def dumps_locks(locks: Iterable[Lock]) -> str:
    """The 0.17 lock file text, identical to what `kernels lock` writes for the same locks."""
    ordered = sorted(locks, key=lambda x: x.dependency.sort_key())
    seen: set[Dependency] = set()
    for lock in ordered:
        if lock.dependency in seen:
            raise ValueError(f"duplicate dependency {lock.dependency}")
        seen.add(lock.dependency)
        if not _OBJECT_ID.match(lock.commit):
            raise ValueError(f"{lock.dependency}: not a full git object id: {lock.commit!r}")
    doc = [
        {"dependency": x.dependency.to_json(), "lock": {"commit": x.commit.lower()}}
        for x in ordered
    ]
    return json.dumps(doc, indent=2, ensure_ascii=False)


def write_lockfile(path: str | os.PathLike[str], locks: Iterable[Lock]) -> None:
    """Write `kernels.lock` (UTF-8, no trailing newline, as `kernels lock` does)."""
    Path(path).write_bytes(dumps_locks(locks).encode("utf-8"))


# ---- the old format's variant hash ----------------------------------------------------------


def _skipped(relpath: str) -> bool:
    return relpath.endswith(".pyc") or "__pycache__" in relpath.split("/")


def variant_hash_inputs(files: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """(filename bytes, raw id bytes), sorted, bytecode dropped: what the hash consumes."""
    out: list[tuple[bytes, bytes]] = []
    for relpath, object_id in files:
        if _skipped(relpath):
            continue
        if not _OBJECT_ID.match(object_id):
            raise ValueError(
                f"{relpath}: file id must be an LFS sha256 or a git blob sha1, got {object_id!r}"
            )
        out.append((relpath.encode("utf-8"), bytes.fromhex(object_id)))
    out.sort()
    return out


def git_lfs_concat_hash(files: Iterable[tuple[str, str]]) -> str:
    """`sha256-<hex>` over sorted (path relative to the variant folder, file id) pairs.

    The file id is the LFS sha256 for LFS files, else the git blob sha1 (hex); `*.pyc` and
    `__pycache__` are skipped. Filename bytes and raw id bytes are fed with no separators, which
    is the old format's definition (REFERENCE.md section 3).
    """
    h = hashlib.sha256()
    for name, raw in variant_hash_inputs(files):
        h.update(name)
        h.update(raw)
    return "sha256-" + h.hexdigest()


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's content (`blob <size>\\0` + bytes)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


# ---- pyproject.toml -------------------------------------------------------------------------


def read_pyproject_dependencies(path: str | os.PathLike[str]) -> list[Dependency]:
    """`[tool.kernels.dependencies]` of a pyproject.toml: `"org/name" = <version>`, in file order.

    Only integer versions are accepted, as `kernels lock` does; a missing table is an error.
    """
    p = Path(path)
    source = str(p)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise LockfileError(f"cannot read: {exc.strerror or exc}", source=source) from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LockfileError(f"not valid TOML: {exc}", source=source) from None
    except RecursionError:
        raise LockfileError("not valid TOML: nested too deeply", source=source) from None
    table: Any = doc
    for key in ("tool", "kernels", "dependencies"):
        table = table.get(key) if isinstance(table, dict) else None
        if table is None:
            raise LockfileError(
                "no [tool.kernels.dependencies] table: nothing to lock", source=source
            )
    if not isinstance(table, dict):
        raise LockfileError("[tool.kernels.dependencies] must be a table", source=source)
    deps: list[Dependency] = []
    for repo_id, version in table.items():
        what = f"tool.kernels.dependencies.{json.dumps(repo_id)}"
        if not _REPO_ID.match(repo_id) or ".." in repo_id:
            raise LockfileError("expected a repo id 'org/name'", source=source, what=what)
        if isinstance(version, bool) or not isinstance(version, int):
            raise LockfileError(
                f"the version must be an integer (branch vN), got {_describe(version)}",
                source=source,
                what=what,
            )
        if not 0 <= version <= MAX_VERSION:
            raise LockfileError(f"version {version} is out of range", source=source, what=what)
        deps.append(Dependency(repo_id, version=version))
    return deps
