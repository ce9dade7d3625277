"""What a publish did: kerneldctl's `--json` document and its human summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kerneld.publish.build import LocalVariant
from kerneld.publish.refs import RefMove


@dataclass
class PublishReport:
    repo_id: str
    commit: str
    destination: str
    target: str
    """mirror | store"""
    variants: list[LocalVariant]
    refs: list[RefMove]
    signed_by: list[str] = field(default_factory=list)
    blobs_written: int = 0
    blobs_present: int = 0
    bytes_written: int = 0
    unchanged: list[str] = field(default_factory=list)
    """Variants that were already published with exactly these files."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "repo_id": self.repo_id,
            "commit": self.commit,
            "destination": self.destination,
            "target": self.target,
            "variants": [v.to_dict() for v in self.variants],
            "unchanged_variants": self.unchanged,
            "refs": [r.to_dict() for r in self.refs],
            "signed_by": self.signed_by,
            "blobs_written": self.blobs_written,
            "blobs_present": self.blobs_present,
            "bytes_written": self.bytes_written,
        }


def summary(report: PublishReport) -> list[str]:
    """Human lines for a finished publish."""
    lines = [
        f"published {report.repo_id}@{report.commit} ({len(report.variants)} variant(s)) to "
        f"{report.target} {report.destination}"
    ]
    for v in report.variants:
        state = " (already there)" if v.name in report.unchanged else ""
        lines.append(f"  {v.name}: {len(v.files)} files, {v.size} bytes, {v.tree_digest}{state}")
        if v.skipped:
            lines.append(f"    left out (bytecode): {', '.join(v.skipped)}")
    for move in report.refs:
        text = {
            "set": "set" if move.previous is None else f"moved from {move.previous}",
            "unchanged": "unchanged",
            "forced": f"moved back from {move.previous} (--force-refs)",
        }[move.action]
        lines.append(f"  ref {move.ref} -> {move.commit}: {text}")
    if report.signed_by:
        lines.append(f"  signed by {', '.join(report.signed_by)}")
    return lines
