"""The caller's own folders: `LOCAL_KERNELS` overrides and `get_local_kernel`.

A local folder is the developer's, so no store trust checks apply (`Candidate.root` is None)
and the import never writes bytecode into it; which build variant of a repository folder to
load follows the same variant rules as the store.
"""

from __future__ import annotations

from pathlib import Path

from kerneld_client import _config
from kerneld_client._types import KernelRequest
from kerneld_client.errors import NoCompatibleVariant, VariantReason
from kerneld_client.loading.context import LoadContext
from kerneld_client.loading.sources import Candidate
from kerneld_client.variants import PlatformFacts, decide


def local_overrides() -> dict[str, Path]:
    """`LOCAL_KERNELS=org/a=/path:org/b=/path`, as `kernels` reads it."""
    raw = _config.raw(_config.ENV_LOCAL_KERNELS)
    if not raw:
        return {}
    out: dict[str, Path] = {}
    for entry in raw.split(":"):
        if "=" not in entry:
            raise ValueError(
                f"Invalid LOCAL_KERNELS entry: {entry}. Expected repo_id_1=path_1:repo_id_2=path_2"
            )
        repo, path = entry.split("=", 1)
        out[repo] = Path(path)
    return out


def folder_candidate(path: Path, facts: PlatformFacts, *, repo_id: str) -> Candidate:
    """The variant folder to load from a local repository (`build/<variant>/`) or variant
    folder; NoCompatibleVariant when none fits this platform."""
    candidates: list[str] = []
    folder: Path | None = None
    for base in (path, path / "build"):
        if not base.is_dir():
            continue
        names = sorted(p.name for p in base.iterdir() if p.is_dir())
        decisions = decide(names, facts)
        if decisions and decisions[0].accepted:
            folder = base / decisions[0].variant
            break
        candidates = names or candidates
    if folder is None and (path / "metadata.json").is_file():
        folder = path
    if folder is None:
        decisions = decide(candidates, facts)
        raise NoCompatibleVariant(
            f"Cannot find a build variant for this system in {path}",  # kernels' words
            reasons=[VariantReason(d.variant, d.accepted, d.reason) for d in decisions],
            repo_id=repo_id,
        )
    return Candidate(
        request=KernelRequest(repo_id, revision=str(path)),
        source="local",
        path=folder.resolve(),
        variant=folder.name,
    )


class LocalSource:
    """`LOCAL_KERNELS` names a folder for the repo: it wins over the store, as in `kernels`."""

    def find(self, request: KernelRequest, ctx: LoadContext) -> Candidate | None:
        path = local_overrides().get(request.repo_id)
        if path is None:
            return None
        return folder_candidate(path, ctx.facts, repo_id=request.repo_id)
