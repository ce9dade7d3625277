"""Validation of untrusted names: relative paths from upstream manifests, repo ids, revisions.

Everything an upstream sends is hostile until checked here. A path is accepted only if it is a
plain relative POSIX path of ordinary components, so that joining it under a directory the store
created can never leave that directory.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable

from kerneld_client.vocabulary import is_commit, is_hex, is_repo_id

from .errors import (
    DuplicatePathError,
    InvalidDigestError,
    InvalidPathError,
    InvalidRepoError,
    InvalidRevisionError,
    PathConflictError,
    UnsupportedFileTypeError,
)
from .layout import FILE_MODE_BLOB, FILE_MODE_EXEC

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
#: Kernel variants are a few directories deep. A deeper tree is refused: removing or walking
#: one ~1000 levels deep overflows Python's recursion (os.walk, shutil.rmtree), so GC could
#: never delete it.
MAX_PATH_DEPTH = 64

_REF = re.compile(r"^[A-Za-z0-9._/+-]{1,255}$")


def validate_relpath(path: object, **ctx: str | None) -> str:
    """Return ``path`` if it is a safe relative path, else raise :class:`InvalidPathError`."""
    if not isinstance(path, str):
        raise InvalidPathError(repr(path), "not a string", **ctx)
    if path == "":
        raise InvalidPathError(path, "empty path", **ctx)
    if "\x00" in path:
        raise InvalidPathError(path, "contains a NUL byte", **ctx)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise InvalidPathError(path, "contains a control character", **ctx)
    if "\\" in path:
        raise InvalidPathError(path, "contains a backslash", **ctx)
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPathError(path, "not valid UTF-8", **ctx) from None
    if len(encoded) > MAX_PATH_BYTES:
        raise InvalidPathError(
            path[:64] + "...", f"longer than {MAX_PATH_BYTES} bytes ({len(encoded)})", **ctx
        )
    if path.startswith("/"):
        raise InvalidPathError(path, "absolute path", **ctx)
    parts = path.split("/")
    if len(parts) > MAX_PATH_DEPTH:
        raise InvalidPathError(
            path[:64] + "...", f"more than {MAX_PATH_DEPTH} components ({len(parts)})", **ctx
        )
    for part in parts:
        if part == "":
            raise InvalidPathError(path, "empty path component ('//' or a trailing '/')", **ctx)
        if part in (".", ".."):
            raise InvalidPathError(path, f"'{part}' component", **ctx)
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise InvalidPathError(
                path[:64] + "...", f"a component is longer than {MAX_COMPONENT_BYTES} bytes", **ctx
            )
    return path


def check_unique_paths(paths: Iterable[str], **ctx: str | None) -> None:
    """Reject duplicates and paths used both as a file and as a directory."""
    files: set[str] = set()
    dirs: set[str] = set()
    for path in paths:
        if path in files:
            raise DuplicatePathError(
                f"path {path!r} appears more than once in the manifest", path=path, **ctx
            )
        files.add(path)
        parts = path.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    both = sorted(files & dirs)
    if both:
        raise PathConflictError(
            f"path {both[0]!r} is both a file and a directory in the manifest", path=both[0], **ctx
        )


def normalize_mode(mode: int, path: str, **ctx: str | None) -> int:
    """Map an upstream file mode (git or POSIX) to the mode the file gets in a tree.

    Regular files become 0444, executable files 0555. Symlinks, submodules and every other file
    type are rejected.
    """
    kind = mode & 0o170000
    if kind == 0o120000:
        raise UnsupportedFileTypeError(
            "symlinks are not accepted in a kernel variant", path=path, **ctx
        )
    if kind == 0o160000:
        raise UnsupportedFileTypeError(
            "git submodules are not accepted in a kernel variant", path=path, **ctx
        )
    if kind not in (0, stat.S_IFREG):
        raise UnsupportedFileTypeError(
            f"file type {oct(kind)} is not a regular file", path=path, **ctx
        )
    if mode & ~0o170777:
        raise UnsupportedFileTypeError(f"unexpected mode bits {oct(mode)}", path=path, **ctx)
    return FILE_MODE_EXEC if mode & 0o111 else FILE_MODE_BLOB


def validate_repo(repo: object) -> str:
    """A Kernel Hub repo id ``org/name`` (the rule: `kerneld_client.vocabulary.is_repo_id`)."""
    if not isinstance(repo, str):
        raise InvalidRepoError(f"repo id must be a string, got {type(repo).__name__}")
    if not is_repo_id(repo):
        raise InvalidRepoError(
            f"invalid repo id {repo!r}: expected 'org/name' of letters, digits, '.', '_', '-' "
            "(no '..')"
        )
    return repo


def validate_commit(commit: object, **ctx: str | None) -> str:
    """A full 40-hex git commit id (lower case)."""
    if not isinstance(commit, str) or not is_commit(commit):
        raise InvalidRevisionError(
            f"invalid commit {commit!r}: expected 40 lower-case hex digits", **ctx
        )
    return commit


def validate_ref(ref: object, **ctx: str | None) -> str:
    """A branch/tag name or commit id (e.g. ``main``, ``v1``, ``refs/pr/3``)."""
    if (
        not isinstance(ref, str)
        or not _REF.match(ref)
        or ".." in ref
        or ref.startswith("/")
        or ref.endswith("/")
    ):
        raise InvalidRevisionError(f"invalid revision {ref!r}", **ctx)
    return ref


def validate_variant(variant: object, **ctx: str | None) -> str:
    """A variant folder name: one safe path component."""
    if not isinstance(variant, str) or "/" in variant:
        raise InvalidPathError(str(variant), "a variant name must be one path component", **ctx)
    return validate_relpath(variant, **ctx)


def validate_hex(value: object, length: int, what: str) -> str:
    if not isinstance(value, str) or not is_hex(value, length):
        raise InvalidDigestError(
            f"invalid {what} {value!r}: expected {length} lower-case hex digits"
        )
    return value


def tree_hex(digest: str) -> str:
    """Accept ``sha256:<hex>`` or bare hex for a tree digest; the bare hex."""
    value = digest.removeprefix("sha256:")
    return validate_hex(value, 64, "tree digest")
