"""Which build variants a kernel has and which fit this process: `has_kernel` and
`get_kernel_variants`. Nothing is imported or downloaded.

The index answers when it knows the commit's full upstream variant list; otherwise the daemon
lists them (ListVariants). Denies apply as they do to loading.
"""

from __future__ import annotations

from kerneld_client import locations
from kerneld_client._types import KernelRequest
from kerneld_client.errors import DaemonUnavailable
from kerneld_client.loading.loaded import store_root
from kerneld_client.loading.published import read_commit
from kerneld_client.variants import Decision, PlatformFacts, decide, device_compatible


def has_variant(request: KernelRequest, facts: PlatformFacts, *, check_arch: bool) -> bool:
    """has_kernel's answer from the index or the daemon; raises the KernelError that made it
    unknowable (the `kernels` integration tells "no" from "kerneld is unavailable")."""
    decisions, archs = variants(request, facts)
    best = next((d for d in decisions if d.accepted), None)
    if best is None:
        return False
    if check_arch and best.variant in archs:
        btype, declared = archs[best.variant]
        return device_compatible(
            btype, declared, facts.backend.type.value, facts.device_capabilities
        )[0]
    return True


def variants(
    request: KernelRequest, facts: PlatformFacts
) -> tuple[list[Decision], dict[str, tuple[str, list[str]]]]:
    """Verdicts for every variant, from the index when it knows them all, else the daemon;
    plus (backend, archs) of the variants present in the store."""
    root = store_root()
    archs: dict[str, tuple[str, list[str]]] = {}
    found = None if root is None else read_commit(root, request)
    if found is not None and found[1] is not None:
        entry = found[1]
        archs = {n: (v.backend or "", list(v.archs)) for n, v in entry.variants.items()}
        if entry.upstream_variants is not None:
            return decide(entry.upstream_variants, facts), archs
    from kerneld_client import _rpc

    try:
        _, decisions = _rpc.list_variants(locations.default_socket(), request, facts)
    except ImportError as exc:
        raise DaemonUnavailable(f"cannot talk to kerneld: {exc}", repo_id=request.repo_id) from exc
    return list(decisions), archs
