"""Kernel arguments: `org/name`, `org/name:VERSION`, `org/name@REVISION`, lock files, pyproject."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneld.ctl.common import EXIT_USAGE, CtlError
from kerneld_client.lockfile import (
    LockfileError,
    load_lockfile,
    read_pyproject_dependencies,
)
from kerneld_client.vocabulary import is_commit, is_repo_id

#: `<repo>`, `<repo>:<version>` or `<repo>@<revision>`; the repo id is checked by its one rule.
_SPEC = re.compile(r"^([^:@\s]+)(?::(\d+)|@(\S+))?$")


@dataclass(frozen=True)
class Spec:
    """One kernel selector, as the wire's KernelRef has it (at most one of the three)."""

    repo_id: str
    version: int | None = None
    revision: str | None = None
    locked_commit: str | None = None

    @property
    def ref(self) -> str | None:
        if self.locked_commit:
            return self.locked_commit
        if self.version is not None:
            return f"v{self.version}"
        return self.revision

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.repo_id}:{self.version}"
        rev = self.locked_commit or self.revision
        return f"{self.repo_id}@{rev}" if rev else self.repo_id

    def to_proto(self) -> Any:
        from kerneld_client.proto import kerneld_pb2

        ref = kerneld_pb2.KernelRef(repo_id=self.repo_id)
        if self.version is not None:
            ref.version = self.version
        elif self.locked_commit:
            ref.locked_commit = self.locked_commit
        elif self.revision:
            ref.revision = self.revision
        return ref

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "version": self.version,
            "revision": self.revision,
            "locked_commit": self.locked_commit,
        }


def parse_spec(text: str) -> Spec:
    """`org/name` (main), `org/name:1` (branch v1), `org/name@rev` (branch, tag or commit)."""
    m = _SPEC.match(text.strip())
    if not m or not is_repo_id(m.group(1)):
        raise CtlError(
            f"bad kernel {text!r}: expected org/name, org/name:VERSION or org/name@REVISION",
            code=EXIT_USAGE,
        )
    repo, version, rev = m.group(1), m.group(2), m.group(3)
    if version is not None:
        return Spec(repo, version=int(version))
    if rev is not None and is_commit(rev):
        return Spec(repo, locked_commit=rev)
    return Spec(repo, revision=rev)


def specs_from_lockfile(path: str) -> list[Spec]:
    """Every entry of a lock file (either format), at its locked commit."""
    try:
        lock = load_lockfile(path)
    except LockfileError as exc:
        raise CtlError(str(exc)) from None
    return [Spec(repo, locked_commit=commit) for repo, commit, _ref in lock.pinned()]


def specs_from_pyproject(path: str) -> list[Spec]:
    p = Path(path)
    if p.is_dir():
        p = p / "pyproject.toml"
    try:
        deps = read_pyproject_dependencies(p)
    except LockfileError as exc:
        raise CtlError(str(exc)) from None
    return [Spec(d.repo_id, version=d.version) for d in deps]


def gather(
    positional: list[str] | None, lock: str | None = None, pyproject: str | None = None
) -> list[Spec]:
    specs = [parse_spec(s) for s in positional or []]
    if lock:
        specs += specs_from_lockfile(lock)
    if pyproject:
        specs += specs_from_pyproject(pyproject)
    return list(dict.fromkeys(specs))
