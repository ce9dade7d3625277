"""`KERNELD_DISABLE`: the layers and kernels a user keeps on PyTorch on purpose.

The variable is a comma list; an entry with a `/` is a repo id, optionally `org/name@revision`
(a ref such as `v1`, or a commit), any other entry a layer name (the mapping's `RMSNorm`, or the
hub layer's name). It is read at each `kernelize`, so a job can change it between calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kerneld_client import _config

__all__ = ["DisableRule", "disable_rules"]


@dataclass(frozen=True)
class DisableRule:
    """One entry of KERNELD_DISABLE: `raw` as written, and the layer or repo it names."""

    raw: str
    layer: str | None = None
    repo: str | None = None
    revision: str | None = None

    def matches_layer(self, names: Iterable[str]) -> bool:
        return self.layer is not None and self.layer in names

    def matches_repo(self, repo_id: str | None, revisions: Iterable[str]) -> bool:
        if self.repo is None or repo_id is None or self.repo != repo_id:
            return False
        return self.revision is None or self.revision in set(revisions)


def disable_rules() -> list[DisableRule]:
    """The entries of KERNELD_DISABLE as it is now (empty entries skipped)."""
    rules = []
    for raw in _config.raw(_config.ENV_DISABLE).split(","):
        entry = raw.strip()
        if not entry:
            continue
        if "/" in entry:
            repo, _, revision = entry.partition("@")
            rules.append(DisableRule(entry, repo=repo.strip(), revision=revision.strip() or None))
        else:
            rules.append(DisableRule(entry, layer=entry))
    return rules
