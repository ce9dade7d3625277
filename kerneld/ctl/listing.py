"""The store's contents as plain dicts: from the daemon's `List` answer or from a store directly.

Both sources produce the same shape (that of `kerneld.v1.ListResponse`), so `ls`, `info` and
their `--json` output do not depend on whether the daemon was asked.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def proto_to_dict(message: Any) -> Any:
    """A protobuf message -> JSON-ready dict: ints stay ints, enums are names, timestamps ISO."""
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.timestamp_pb2 import Timestamp

    if isinstance(message, Timestamp):
        if not message.seconds and not message.nanos:
            return None
        return message.ToDatetime(tzinfo=timezone.utc).isoformat()
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                out[field.name] = [proto_to_dict(v) for v in value]
            elif field.has_presence and message.HasField(field.name):
                out[field.name] = proto_to_dict(value)
            else:
                out[field.name] = None
        elif field.type == FieldDescriptor.TYPE_ENUM:
            names = field.enum_type.values_by_number
            conv = [names[v].name if v in names else v for v in value] if _rep(field) else None
            out[field.name] = (
                conv if conv is not None else (names[value].name if value in names else value)
            )
        elif _rep(field):
            out[field.name] = list(value)
        else:
            out[field.name] = value
    return out


def _rep(field: Any) -> bool:
    return bool(field.is_repeated)


def _iso(ts: float) -> str | None:
    if not ts:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def store_listing(store: Any, repos: list[str] | None = None) -> list[dict[str, Any]]:
    """What `Admin.List` answers, computed from a store (read-only is enough)."""
    from kerneld.store.gc import pinned_trees
    from kerneld.store.index import ALL

    now = time.time()
    all_variants = [v for r in store.repos() for v in store.variants_of(r)]
    all_refs = [r for repo in store.repos() for r in store.refs_of(repo)]
    pins = store.pins()
    pinned = pinned_trees(pins, all_refs, all_variants)
    leases: dict[str, int] = {}
    for lease in store.leases():
        if lease.expires_at > now:
            leases[lease.tree] = leases.get(lease.tree, 0) + 1
    wanted = set(repos or [])
    out: list[dict[str, Any]] = []
    for repo in store.repos():
        if wanted and repo not in wanted:
            continue
        refs = store.refs_of(repo)
        denies = store.denies(repo)
        by_commit: dict[str, dict[str, Any]] = {}

        def revision(commit: str, by_commit: dict[str, dict[str, Any]] = by_commit) -> Any:
            return by_commit.setdefault(
                commit,
                {"commit": commit, "refs": [], "variants": [], "pinned": False, "denied": False},
            )

        for v in store.variants_of(repo):
            tree = store.tree(v.tree)
            if tree is None or tree.state != "live":
                continue
            revision(v.commit)["variants"].append(
                {
                    "variant": v.variant,
                    "tree_digest": f"sha256:{v.tree}",
                    "path": str(store.tree_path(v.tree)),
                    "size_bytes": tree.size,
                    "files": tree.files,
                    "last_resolved": _iso(tree.last_resolved),
                    "pinned": v.tree in pinned,
                    "active_leases": leases.get(v.tree, 0),
                    "provenance": _provenance(store.provenance_of(v.tree)),
                }
            )
        for r in refs:
            revision(r.commit)["refs"].append(r.ref)
        ref_commit = {r.ref: r.commit for r in refs}
        for p in pins:
            if p.repo == repo and p.revision != ALL and p.variant == ALL:
                commit = ref_commit.get(p.revision, p.revision)
                if commit in by_commit:
                    by_commit[commit]["pinned"] = True
        for d in denies:
            if d.revision != ALL:
                commit = ref_commit.get(d.revision, d.revision)
                if commit in by_commit:
                    by_commit[commit]["denied"] = True
        out.append(
            {
                "repo_id": repo,
                "revisions": sorted(by_commit.values(), key=lambda r: r["commit"]),
                "pinned": any(p.repo == repo and p.revision == ALL for p in pins),
                "denied": any(d.revision == ALL for d in denies),
            }
        )
    return out


def _provenance(record: Any) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "status": record.status,
        "signer": record.signer,
        "issuer": record.issuer,
        "detail": record.detail,
        "checked_at": _iso(record.checked_at),
    }


def read_metadata(path: str) -> dict[str, Any] | None:
    """The interesting fields of a published tree's metadata.json (None if unreadable)."""
    try:
        doc = json.loads((Path(path) / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    backend: dict[str, Any] = doc["backend"] if isinstance(doc.get("backend"), dict) else {}
    digest: dict[str, Any] = doc["digest"] if isinstance(doc.get("digest"), dict) else {}
    return {
        "id": doc.get("id"),
        "name": doc.get("name"),
        "version": doc.get("version"),
        "license": doc.get("license"),
        "backend": backend.get("type"),
        "archs": backend.get("archs") or [],
        "python_depends": doc.get("python-depends") or [],
        "kernel_depends": doc.get("kernel-depends") or [],
        "digest_algorithm": digest.get("algorithm"),
        # Declared bit-for-bit deterministic (docs/determinism.md): true, false or absent.
        "deterministic": doc["deterministic"]
        if isinstance(doc.get("deterministic"), bool)
        else None,
    }
