"""`get_kernel_variants` with `kernels`' result types: `VariantAccepted` and `VariantRejected`.

kerneld's own ranking (`kerneld_client.loader.get_kernel_variants`, one `Decision` per variant)
answers; this gives each verdict `kernels`' dataclass, with the variant as a `VariantName`: the
variant's name, a `str` that also has `kernels`' `variant_str`. Both also have `accepted` (and
`reason`), as kerneld_client's verdicts had before they took `kernels`' types. Accepted
variants come first, the preferred one leading, as in `kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["VariantAccepted", "VariantName", "VariantRejected", "get_kernel_variants"]


class VariantName(str):
    """A build variant's name (`torch-cpu`, `torch29-cxx11-cu128-x86_64-linux`...)."""

    __slots__ = ()

    @property
    def variant_str(self) -> str:
        """`kernels`' name for the variant's folder name."""
        return str(self)


@dataclass(unsafe_hash=True)
class VariantAccepted:
    """A variant that is compatible with this process."""

    variant: VariantName
    #: Not fields: the verdict read the way kerneld's `Decision` has it (`d.accepted`).
    accepted: ClassVar[bool] = True
    reason: ClassVar[str] = ""


@dataclass(unsafe_hash=True)
class VariantRejected:
    """A variant that is not compatible with this process, and why."""

    variant: VariantName
    reason: str
    accepted: ClassVar[bool] = False


def get_kernel_variants(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
) -> list[VariantAccepted | VariantRejected]:
    """Every build variant of the revision with its verdict for this process (accepted first,
    best first). Raises the typed errors of kerneld_client (FileNotFoundError for a kernel that
    cannot be had)."""
    from kerneld_client import loader

    verdicts: list[VariantAccepted | VariantRejected] = []
    for decision in loader.get_kernel_variants(
        repo_id, revision=revision, version=version, backend=backend
    ):
        name = VariantName(decision.variant)
        verdicts.append(
            VariantAccepted(name) if decision.accepted else VariantRejected(name, decision.reason)
        )
    return verdicts
