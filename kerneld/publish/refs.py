"""Repo and ref names, and where a publish may move a ref.

A ref only moves to a commit that descends from the one it points at (git ancestry in the
author's checkout), unless forced, so publishing an older build never rolls `v1` back by
accident. `plan_ref` decides it, for a mirror's refs and a store's alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kerneld.publish import PublishError
from kerneld.store import StoreError
from kerneld.store.paths import validate_ref, validate_repo
from kerneld.upstream.base import check_repo_id
from kerneld_client.vocabulary import is_commit

#: `is_ancestor(older, newer)`: True/False, or None when it cannot be told (unknown commit).
Ancestry = Callable[[str, str], bool | None]


def check_names(repo_id: str, refs: Sequence[str]) -> None:
    """Repo id and ref names, checked as the store and the mirror layout check them."""
    try:
        validate_repo(repo_id)
        check_repo_id(repo_id)
        for ref in refs:
            validate_ref(ref, repo_id=repo_id)
    except (StoreError, ValueError) as exc:
        raise PublishError(str(exc), usage=True) from None
    for ref in refs:
        if is_commit(ref):
            raise PublishError(
                f"--ref takes a branch or tag name, not a commit: {ref!r}", usage=True
            )


@dataclass(frozen=True)
class RefMove:
    ref: str
    commit: str
    previous: str | None
    action: str
    """set (new ref, or a forward move) | unchanged | forced (moved back or sideways)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "commit": self.commit,
            "previous": self.previous,
            "action": self.action,
        }


def plan_ref(
    ref: str,
    current: str | None,
    commit: str,
    ancestry: Ancestry | None,
    *,
    force: bool,
) -> RefMove:
    """Where `ref` goes: forward only (`current` is an ancestor of `commit`), unless `force`."""
    if current is None:
        return RefMove(ref, commit, None, "set")
    if current == commit:
        return RefMove(ref, commit, current, "unchanged")
    forward = ancestry(current, commit) if ancestry is not None else None
    if forward:
        return RefMove(ref, commit, current, "set")
    if force:
        return RefMove(ref, commit, current, "forced")
    backward = ancestry(commit, current) if ancestry is not None else None
    if backward:
        why = f"a newer commit (it descends from {commit}): --ref {ref} would move {ref} back"
    elif forward is False and backward is False:
        why = f"which is not an ancestor of {commit} (the histories diverged)"
    elif ancestry is None:
        why = f"and outside a git checkout it cannot be told whether {commit} is newer"
    else:
        why = f"which this checkout does not have, so it cannot be told whether {commit} is newer"
    raise PublishError(
        f"{ref} points at {current}, {why}",
        hint=f"drop --ref {ref} to publish {commit} without moving it, or pass --force-refs "
        f"to move {ref} anyway (a rollback)",
    )
