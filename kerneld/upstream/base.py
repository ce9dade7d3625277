"""The upstream interface and the value types every upstream returns."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from kerneld_client.vocabulary import is_repo_id

#: Files never taken from an upstream (REFERENCE.md section 1).
SKIPPED_PARTS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc",)


def check_repo_id(repo_id: str) -> str:
    """Validate an `org/name` repo id before it reaches a URL or a path."""
    if not is_repo_id(repo_id):
        raise ValueError(
            f"invalid kernel repo id {repo_id!r}: expected 'org/name' "
            "(letters, digits, '.', '_', '-')"
        )
    return repo_id


def skipped(path: str) -> bool:
    """Bytecode caches are never part of a variant, whatever the repo holds."""
    parts = path.split("/")
    return any(p in SKIPPED_PARTS for p in parts) or path.endswith(SKIPPED_SUFFIXES)


@dataclass(frozen=True)
class Refs:
    """Branches and tags of a repo, name -> 40-hex commit."""

    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def versions(self) -> dict[int, str]:
        """Version branches `vN` -> commit (REFERENCE.md: versions are branches)."""
        out: dict[int, str] = {}
        for name, commit in self.branches.items():
            m = re.fullmatch(r"v(\d+)", name)
            if m:
                out[int(m.group(1))] = commit
        return out


@dataclass(frozen=True)
class RemoteFile:
    """One file of a variant as the upstream describes it.

    `path` is relative to the variant folder and still untrusted: the store validates it.
    At least one of `sha256` (LFS/Xet files, mirrors) and `git_sha1` (plain git blobs) is set.
    """

    path: str
    size: int
    sha256: str | None = None
    git_sha1: str | None = None


class Upstream(Protocol):
    """What the resolver needs from a source of kernels."""

    name: str

    def list_refs(self, repo_id: str) -> Refs: ...

    def resolve_revision(self, repo_id: str, revision: str) -> str:
        """Branch, tag, `refs/...` or commit -> 40-hex commit."""
        ...

    def list_variants(self, repo_id: str, commit: str) -> list[str]: ...

    def list_files(self, repo_id: str, commit: str, variant: str) -> list[RemoteFile]: ...

    def open_file(
        self, repo_id: str, commit: str, variant: str, file: RemoteFile, *, offset: int = 0
    ) -> AbstractContextManager[Iterator[bytes]]:
        """Stream the bytes of `file` from `offset` on; the caller verifies them."""
        ...
