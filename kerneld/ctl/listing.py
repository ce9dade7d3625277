"""The store's contents as plain dicts: from the daemon's `List` answer or from a store directly.

Both sources produce the same shape (that of `kerneld.v1.ListResponse`), so `ls`, `info` and
their `--json` output do not depend on whether the daemon was asked.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from kerneld_client.metadata import backend_of


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


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _iso(ts: float) -> str | None:
    """A time as the daemon's answer has it, to the microsecond: a protobuf Timestamp holds
    whole nanoseconds (the daemon truncates) and its datetime drops what is below a
    microsecond. (`datetime.fromtimestamp` rounds instead, one microsecond off at times.)"""
    if not ts:
        return None
    return (_EPOCH + timedelta(microseconds=int(ts * 1e9) // 1000)).isoformat()


def store_listing(store: Any, repos: list[str] | None = None) -> list[dict[str, Any]]:
    """What `Admin.List` answers, computed from a store (read-only is enough)."""
    from kerneld.store.inventory import inventory

    return [
        {
            "repo_id": k.repo_id,
            "revisions": [
                {
                    "commit": r.commit,
                    "refs": r.refs,
                    "variants": [
                        {
                            **{f: getattr(v, f) for f in _VARIANT_FIELDS},
                            "last_resolved": _iso(v.last_resolved),
                            "provenance": _provenance(v.provenance),
                            "kernel_depends": [],  # as Admin.List without with_depends
                        }
                        for v in r.variants
                    ],
                    "pinned": r.pinned,
                    "denied": r.denied,
                    "denied_by": r.denied_by,
                    "denied_refs": r.denied_refs,
                }
                for r in k.revisions
            ],
            "pinned": k.pinned,
            "denied": k.denied,
        }
        for k in inventory(store, repos)
    ]


_VARIANT_FIELDS = (
    "variant",
    "tree_digest",
    "path",
    "size_bytes",
    "files",
    "pinned",
    "active_leases",
)


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
    backend_type, archs = backend_of(doc)
    digest: dict[str, Any] = doc["digest"] if isinstance(doc.get("digest"), dict) else {}
    return {
        "id": doc.get("id"),
        "name": doc.get("name"),
        "version": doc.get("version"),
        "license": doc.get("license"),
        "backend": backend_type,
        "archs": archs,
        "python_depends": doc.get("python-depends") or [],
        "kernel_depends": doc.get("kernel-depends") or [],
        "digest_algorithm": digest.get("algorithm"),
        # `files`, or `zip` (the package in <id>.zip, kernels 0.19); as the doc says it.
        "build_layout": doc.get("build-layout") or "files",
        # Declared bit-for-bit deterministic (docs/determinism.md): true, false or absent.
        "deterministic": doc["deterministic"]
        if isinstance(doc.get("deterministic"), bool)
        else None,
    }
