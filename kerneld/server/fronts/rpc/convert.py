"""Wire <-> domain conversions for the services (protobuf stays out of resolve/store/prefetch)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from kerneld.pipeline.resolve import KernelSpec, Resolution
from kerneld.server.services.bounds import (
    MAX_CLIENT,
    MAX_DEVICES,
    MAX_DIGEST,
    MAX_FACT,
    MAX_LEASE_ID,
    MAX_REASON,
    MAX_REPO_ID,
    MAX_REVISION,
    MAX_VARIANT,
    RequestTooLarge,
    check_field,
    clip,
)
from kerneld.store import Lease
from kerneld_client.metadata import backend_of, kernel_depends
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.variants import Decision, PlatformFacts
from kerneld_client.vocabulary import is_commit
from kerneld_client.wire import decision_to_proto, facts_from_proto


def ts(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


# ---- bounds on what a caller may send: one definition for every route (bounds.py) ----------


def check_ref(ref: pb.KernelRef, field: str = "kernel") -> None:
    check_field(ref.repo_id, MAX_REPO_ID, f"{field}.repo_id")
    check_field(ref.revision, MAX_REVISION, f"{field}.revision")
    check_field(ref.locked_commit, MAX_REVISION, f"{field}.locked_commit")


def check_platform(facts: pb.PlatformFacts, field: str = "platform") -> None:
    for name in ("torch_version", "cpu", "os", "python_version", "macos_version"):
        check_field(getattr(facts, name), MAX_FACT, f"{field}.{name}")
    check_field(facts.tvm_ffi_version, MAX_FACT, f"{field}.tvm_ffi_version")
    check_field(facts.backend.type, MAX_FACT, f"{field}.backend.type")
    check_field(facts.backend.version, MAX_FACT, f"{field}.backend.version")
    devices = facts.device_capabilities
    if len(devices) > MAX_DEVICES:
        raise RequestTooLarge(
            f"{field}.device_capabilities has {len(devices)} entries; the limit is {MAX_DEVICES}"
        )
    for i, capability in enumerate(devices):
        check_field(capability, MAX_FACT, f"{field}.device_capabilities[{i}]")


def check_resolve(request: pb.ResolveRequest, field: str = "") -> None:
    """RequestTooLarge unless every field of a Resolve (or ResolveMany entry) is in bounds."""
    check_ref(request.kernel, f"{field}kernel")
    check_platform(request.platform, f"{field}platform")
    check_field(request.variant, MAX_VARIANT, f"{field}variant")
    check_field(request.client, MAX_CLIENT, f"{field}client")


def check_list_variants(request: pb.ListVariantsRequest) -> None:
    check_ref(request.kernel)
    check_platform(request.platform)


def check_lease_id(lease_id: str) -> None:
    check_field(lease_id, MAX_LEASE_ID, "lease_id")


def check_report(request: pb.ReportSuspectRequest) -> str:
    """The hex digest a ReportSuspect names; RequestTooLarge for a field over its bound,
    ValueError for a digest that is not one (both INVALID_ARGUMENT)."""
    check_field(request.tree_digest, MAX_DIGEST, "tree_digest")
    check_field(request.repo_id, MAX_REPO_ID, "repo_id")
    check_field(request.commit, MAX_REVISION, "commit")
    check_field(request.variant, MAX_VARIANT, "variant")
    check_field(request.reason, MAX_REASON, "reason")
    hexd = request.tree_digest.removeprefix("sha256:")
    if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise ValueError(
            f"tree_digest must be 'sha256:' and 64 lowercase hex digits (the tree's directory "
            f"name in the store), got {clip(request.tree_digest, 80)!r}"
        )
    return hexd


def spec_from_ref(ref: pb.KernelRef) -> KernelSpec:
    """KernelRef -> KernelSpec; ValueError (INVALID_ARGUMENT) for a bad id or selector."""
    if not ref.repo_id:
        raise ValueError("kernel.repo_id is required ('org/name')")
    which = ref.WhichOneof("selector")
    if which == "version":
        return KernelSpec(ref.repo_id, version=ref.version)
    if which == "revision":
        if not ref.revision:
            raise ValueError("kernel.revision must not be empty")
        return KernelSpec(ref.repo_id, revision=ref.revision)
    if which == "locked_commit":
        return KernelSpec(ref.repo_id, locked_commit=ref.locked_commit)
    return KernelSpec(ref.repo_id)


def ref_to_proto(spec: KernelSpec) -> pb.KernelRef:
    if spec.version is not None:
        return pb.KernelRef(repo_id=spec.repo_id, version=spec.version)
    if spec.locked_commit is not None:
        return pb.KernelRef(repo_id=spec.repo_id, locked_commit=spec.locked_commit)
    if spec.revision is not None:
        return pb.KernelRef(repo_id=spec.repo_id, revision=spec.revision)
    return pb.KernelRef(repo_id=spec.repo_id)


class FactsCache:
    """Parsed PlatformFacts by their wire bytes: every rank of a job sends the same facts, so
    parsing them once saves work on the warm path."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._cache: OrderedDict[bytes, PlatformFacts] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, message: pb.PlatformFacts, present: bool) -> PlatformFacts:
        if not present:
            raise ValueError("platform facts are required (at least cpu and os)")
        key = message.SerializeToString(deterministic=True)
        with self._lock:
            facts = self._cache.get(key)
            if facts is not None:
                self._cache.move_to_end(key)
                return facts
        facts = facts_from_proto(message)
        with self._lock:
            self._cache[key] = facts
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return facts


class MetadataCache:
    """KernelMetadata by tree digest: trees are immutable, so metadata.json is read once."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._cache: OrderedDict[str, pb.KernelMetadata] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str, tree: Path) -> pb.KernelMetadata:
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                return hit
        meta = metadata_to_proto(tree / "metadata.json")
        with self._lock:
            self._cache[digest] = meta
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return meta


def metadata_to_proto(path: Path) -> pb.KernelMetadata:
    """What a client checks before importing (id, backend, archs, depends) plus the raw JSON."""
    try:
        raw = path.read_text(encoding="utf-8")
        doc = json.loads(raw)
    except (OSError, ValueError):
        return pb.KernelMetadata()
    if not isinstance(doc, dict):
        return pb.KernelMetadata(raw_json=raw)
    meta = pb.KernelMetadata(raw_json=raw)
    for key, attr in (("id", "id"), ("name", "name"), ("license", "license")):
        if isinstance(doc.get(key), str):
            setattr(meta, attr, doc[key])
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and 0 <= version < 2**32:
        meta.version = version
    backend_type, archs = backend_of(doc)
    if backend_type is not None:
        meta.backend_type = backend_type
    meta.backend_archs.extend(archs)
    depends = doc.get("python-depends")
    if isinstance(depends, list):
        meta.python_depends.extend(d for d in depends if isinstance(d, str))
    try:
        depends_on = kernel_depends(doc)
    except ValueError:
        depends_on = []  # resolution refuses such a build (MetadataError); nothing to show
    for dep in depends_on:
        ref = pb.KernelRef(repo_id=dep.repo_id)
        if dep.version is not None:
            ref.version = dep.version
        else:
            ref.revision = str(dep.revision)
        meta.kernel_depends.append(ref)
    meta.deterministic = doc.get("deterministic") is True
    return meta


def decisions_to_proto(decisions: Iterable[Decision], cached: set[str]) -> list[pb.VariantDecision]:
    return [decision_to_proto(d, cached=d.variant in cached) for d in decisions]


def resolved_to_proto(
    res: Resolution,
    leases: Mapping[str, Lease],
    *,
    cached: Callable[[str, str], set[str]],
    metadata: MetadataCache,
) -> pb.ResolvedKernel:
    """One Resolution (and its dependencies, recursively) as a ResolvedKernel; `cached(repo,
    commit)` names the variants of that commit already in the store."""
    hit = res.hit
    ref = res.spec.ref
    out = pb.ResolvedKernel(
        repo_id=res.spec.repo_id,
        ref="" if res.spec.locked_commit is not None or is_commit(ref) else ref,
        commit=res.commit,
        variant=res.variant,
        path=str(hit.path),
        tree_digest=hit.digest,
        stale=res.stale,
        fetched=res.fetched is not None,
        upstream=res.fetched.upstream if res.fetched is not None else "",
        metadata=metadata.get(hit.digest, hit.path),
    )
    lease = leases.get(hit.digest)
    if lease is not None:
        out.lease.CopyFrom(pb.Lease(id=lease.id, expires_at=ts(lease.expires_at)))
    out.variants.extend(decisions_to_proto(res.decisions, cached(res.spec.repo_id, res.commit)))
    for dep in res.dependencies:
        out.dependencies.append(resolved_to_proto(dep, leases, cached=cached, metadata=metadata))
    return out


def set_leases(out: pb.ResolvedKernel, res: Resolution, leases: Mapping[str, Lease]) -> None:
    """Fill in the lease of `out` and of its dependencies (same order as `res`)."""
    lease = leases.get(res.hit.digest)
    if lease is not None:
        out.lease.id = lease.id
        out.lease.expires_at.FromNanoseconds(int(lease.expires_at * 1e9))
    for dep_out, dep in zip(out.dependencies, res.dependencies, strict=True):
        set_leases(dep_out, dep, leases)
