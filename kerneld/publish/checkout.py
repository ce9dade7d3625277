"""The commit a build is published as, read from the author's git checkout around it.

Inside a checkout the commit is its HEAD, and a checkout with uncommitted changes is refused
(unless `--allow-dirty`): the commit id would not describe the build. Outside one, the author
names the commit (`--commit`). The checkout also answers which of two commits is newer, for
refs that must only move forward (`kerneld.publish.refs`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kerneld.publish import PublishError
from kerneld.publish.refs import Ancestry
from kerneld.store import StoreError
from kerneld.store.paths import validate_commit


def check_commit(commit: str) -> str:
    commit = commit.strip().lower()
    if len(commit) == 64 and all(c in "0123456789abcdef" for c in commit):
        raise PublishError(
            f"sha256 commit ids are not supported ({commit}); kerneld names revisions by "
            "40-hex sha1 commit ids",
            usage=True,
        )
    try:
        return validate_commit(commit)
    except StoreError:
        raise PublishError(
            f"--commit takes a full commit id (40 hex digits), got {commit!r}", usage=True
        ) from None


class GitCheckout:
    """The author's git checkout around the build: its HEAD, whether it is clean, and which of
    two commits is newer (for refs that must only move forward)."""

    def __init__(self, top: Path) -> None:
        self.top = top

    @staticmethod
    def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        # No optional locks: `git status` must not rewrite the index of a publish that writes
        # nothing; C locale: the messages are matched below.
        env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
        return subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    @classmethod
    def find(cls, path: Path) -> GitCheckout | None:
        """The checkout `path` is in; None when it is in none (or git is not installed)."""
        try:
            proc = cls._run(path, "rev-parse", "--show-toplevel")
        except FileNotFoundError:
            return None
        if proc.returncode == 0:
            return cls(Path(proc.stdout.strip()))
        if "not a git repository" in proc.stderr:
            return None
        raise PublishError(
            f"git cannot read the checkout around {path}: {proc.stderr.strip()}",
            hint="run kerneldctl publish as the checkout's owner (git refuses repositories "
            "other users own), or publish a copy of the build made outside the checkout with "
            "--commit",
        )

    def head(self) -> str:
        proc = self._run(self.top, "rev-parse", "--verify", "-q", "HEAD^{commit}")
        if proc.returncode != 0:
            raise PublishError(
                f"the git checkout {self.top} has no commit yet",
                hint="commit the kernel's sources (and build/, if the repo tracks it) first",
            )
        return proc.stdout.strip()

    def changes(self, exclude: Sequence[Path] = ()) -> list[str]:
        """`git status --porcelain` lines: uncommitted changes and untracked files, except
        below `exclude` (the publish's own destination, when it is inside the checkout)."""
        spec = ["--", "."]
        for path in exclude:
            resolved = path.resolve()
            if resolved == self.top.resolve() or self.top.resolve() in resolved.parents:
                spec.append(f":(exclude){resolved.relative_to(self.top.resolve()).as_posix()}")
        proc = self._run(self.top, "status", "--porcelain", "--untracked-files=normal", *spec)
        if proc.returncode != 0:
            raise PublishError(f"git status failed in {self.top}: {proc.stderr.strip()}")
        return [line for line in proc.stdout.splitlines() if line.strip()]

    def is_ancestor(self, older: str, newer: str) -> bool | None:
        proc = self._run(self.top, "merge-base", "--is-ancestor", older, newer)
        if proc.returncode in (0, 1):
            return proc.returncode == 0
        return None  # a commit this checkout does not have


@dataclass(frozen=True)
class Revision:
    commit: str
    checkout: GitCheckout | None
    dirty: list[str] = field(default_factory=list)
    """The uncommitted changes published anyway (--allow-dirty)."""

    def ancestry(self) -> Ancestry | None:
        return self.checkout.is_ancestor if self.checkout is not None else None


def resolve_revision(path: Path, commit: str | None) -> Revision:
    """The commit the build at `path` is published as: HEAD of its git checkout, or `commit`
    outside one (a commit is required there; inside one it must be HEAD, since the dirty-tree
    check says nothing about another commit)."""
    checkout = GitCheckout.find(path)
    if checkout is None:
        if commit is None:
            raise PublishError(
                f"{path} is not in a git checkout, so its commit cannot be read",
                hint="give the commit this build is of with --commit (40 hex digits)",
                usage=True,
            )
        return Revision(check_commit(commit), None)
    head = checkout.head()
    if commit is not None and check_commit(commit) != head:
        raise PublishError(
            f"{path} is in the git checkout {checkout.top}, whose HEAD is {head}, not {commit}",
            hint=f"check out {commit} and build it, drop --commit to publish {head}, or publish "
            "a copy of the build made outside the checkout",
            usage=True,
        )
    return Revision(check_commit(head), checkout)


def check_clean(
    revision: Revision, *, allow_dirty: bool, destination: Path | None = None
) -> Revision:
    """Refuse a checkout with uncommitted changes: the commit id would not describe the build.
    `destination` (a mirror or store inside the checkout) does not count as a change."""
    if revision.checkout is None:
        return revision
    changes = revision.checkout.changes([destination] if destination is not None else [])
    if not changes:
        return revision
    if allow_dirty:
        return Revision(revision.commit, revision.checkout, changes)
    shown = "\n  ".join(changes[:10]) + ("\n  ..." if len(changes) > 10 else "")
    raise PublishError(
        f"the git checkout {revision.checkout.top} has uncommitted changes, so commit "
        f"{revision.commit} does not describe this build:\n  {shown}",
        hint="commit them (a new commit for the new build), or pass --allow-dirty to publish "
        f"the build as {revision.commit} anyway",
    )
