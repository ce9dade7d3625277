"""How a `kernels` load becomes a kerneld load, and what the caller gets when kerneld cannot.

`plan_for()` reads a `get_kernel_with_resolver` call (its resolver chain and validators) as a
kerneld request, or leaves it to `kernels` (a local kernel, an unlocked one, a resolver this
module does not know); `through_kerneld()` loads it with no fallback, so the typed error reaches
`fall_back()`, which applies $KERNELD_FALLBACK. Around the load, kernels' own metadata validators
run (`validate_metadata()`, before the kernel's code does) and the result is registered in kernels'
registry of loaded kernels (`registered()`), as `kernels` would.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kerneld_client import _config, loader
from kerneld_client._types import KernelRequest
from kerneld_client.errors import (
    KernelDenied,
    KernelError,
    KernelLoadError,
    KernelUnavailable,
    NoCompatibleVariant,
)
from kerneld_client.integrations._kernels_api import KernelsApi
from kerneld_client.loading import published
from kerneld_client.loading.call import run
from kerneld_client.loading.context import MISSING, LoadOptions, parse_request
from kerneld_client.loading.local import local_overrides

__all__ = [
    "FOR_LAYER",
    "Plan",
    "Refused",
    "cannot_be_had",
    "fall_back",
    "fallback_policy",
    "is_local",
    "note_newer_version",
    "plan_for",
    "registered",
    "through_kerneld",
    "validate_metadata",
]


class Plan:
    """How to ask kerneld for what a `kernels` call wants."""

    __slots__ = ("allow_fetch", "check_arch", "locks", "request", "trust_remote_code")

    def __init__(
        self,
        request: KernelRequest,
        *,
        allow_fetch: bool,
        check_arch: bool,
        locks: Mapping[str, str] | None = None,
        trust_remote_code: bool | list[str] = False,
    ) -> None:
        self.request = request
        self.allow_fetch = allow_fetch
        self.check_arch = check_arch
        self.locks = locks or {}
        self.trust_remote_code = trust_remote_code


def is_local(repo_id: str) -> bool:
    """LOCAL_KERNELS redirects this repo (or is malformed): `kernels` handles it."""
    try:
        return repo_id in local_overrides()
    except ValueError:
        return True


def _arch_checked(api: KernelsApi, validator: Any) -> bool:
    if isinstance(validator, api.AllValidator):
        return any(isinstance(v, api.ArchValidator) for v in validator.validators)
    return True


def plan_for(api: KernelsApi, kernel: Any, resolver: Any, validator: Any) -> Plan | None:
    """kerneld's request for a `get_kernel_with_resolver` call, or None to leave it to
    `kernels` (a local path first in the chain, an unknown resolver, an unlocked kernel)."""
    chain = list(resolver.resolvers) if isinstance(resolver, api.SequentialResolver) else [resolver]
    check_arch = _arch_checked(api, validator)
    for item in chain:
        if isinstance(item, api.NoopResolver):
            continue
        if isinstance(item, api.RepoPathsResolver):
            if kernel.repo_id in item.local_kernels:
                return None
            continue
        if isinstance(item, api.HubResolver | api.HubCacheResolver):
            version = kernel.version
            if isinstance(version, api.Version):
                req = parse_request(kernel.repo_id, version.version, None)
            elif isinstance(version, api.Revision):
                req = parse_request(kernel.repo_id, None, version.revision)
            else:
                return None
            # HubCacheResolver is HF_HUB_OFFLINE: serve what the store has, download nothing.
            return Plan(
                req,
                allow_fetch=isinstance(item, api.HubResolver),
                check_arch=check_arch,
                trust_remote_code=_trust(item),
            )
        if isinstance(item, api.LockedHubResolver | api.LockedHubCacheResolver):
            lock = item.kernel_locks.get(kernel)
            if lock is None:
                return None  # kernels raises its "not locked" error
            parse_request(kernel.repo_id, None, None, required=False)  # repo id syntax
            locks: dict[str, str] = {}
            for dep, dep_lock in item.kernel_locks.items():
                locks.setdefault(dep.repo_id, dep_lock.commit)
            locks[kernel.repo_id] = lock.commit
            return Plan(
                KernelRequest(kernel.repo_id, locked_commit=lock.commit),
                allow_fetch=isinstance(item, api.LockedHubResolver),
                check_arch=check_arch,
                locks=locks,
                trust_remote_code=_trust(item),
            )
        return None
    return None


def _trust(resolver: Any) -> bool | list[str]:
    """The caller's `trust_remote_code`, as kernels' Hub resolvers carry it."""
    trust = getattr(resolver, "trust_remote_code", False)
    return trust if isinstance(trust, bool) else [str(r) for r in trust]


def through_kerneld(
    plan: Plan,
    backend: str | None,
    before_import: Callable[[Path, str], None] | None = None,
) -> loader.LoadedKernel:
    """kerneld_client's load with no fallback (typed errors), memoised like get_kernel."""
    module = run(
        plan.request,
        backend=backend,
        options=LoadOptions(
            check_arch=plan.check_arch,
            allow_fetch=plan.allow_fetch,
            locks=plan.locks,
            trust_remote_code=plan.trust_remote_code,
            before_import=before_import,
        ),
        fallback=MISSING,
        policy="error",
        hub_allowed=False,
    )
    for record in loader.loaded_kernels():
        if record.module is module:
            return record
    raise KernelLoadError("the loaded kernel is not registered", repo_id=plan.request.repo_id)


def fallback_policy() -> str:
    """`kernels` (unset, `hub`), `torch` or `error` (also KERNELD_REQUIRE=1)."""
    if _config.require():
        return "error"
    raw = _config.raw(_config.ENV_FALLBACK).lower()
    return raw if raw in ("torch", "error") else "kernels"


def fall_back(exc: KernelError, req: KernelRequest) -> None:
    """Return to let kernels' own code run, or raise what the caller gets instead."""
    what = f"{req.repo_id}@{req.ref}"
    policy = fallback_policy()
    if policy == "error":
        raise exc
    if isinstance(exc, KernelDenied | NoCompatibleVariant):
        _config.warn_once(req.repo_id, f"kerneld: {exc}; kernel {what} is not loaded")
        raise exc
    if policy == "torch":
        _config.warn_once(
            req.repo_id,
            f"kerneld could not provide kernel {what} ({exc.message}); KERNELD_FALLBACK=torch: "
            "not loading it (layers keep their PyTorch forward)",
        )
        raise KernelUnavailable(
            f"kerneld could not provide it: {exc.message}", repo_id=req.repo_id, revision=req.ref
        ) from exc
    _config.warn_once(
        req.repo_id,
        f"kerneld could not provide kernel {what} ({exc.message}); "
        "loading it with the kernels package's own resolver instead",
    )


#: Where the errors of a download come from: kernels' resolver failing on the network or the
#: Hub (no such repo, no access, no connection), not on the kernel itself.
_TRANSPORT_MODULES = ("huggingface_hub", "httpx", "httpx2", "requests", "urllib3")


#: True while a layer repository of kernels loads its kernel (LayerRepository.load, FuncRepository
#: .load): the one place where a Hub error of kernels' own resolver must not fail the caller.
FOR_LAYER: contextvars.ContextVar[bool] = contextvars.ContextVar("kerneld_for_layer", default=False)


def cannot_be_had(err: Exception, exc: KernelError, req: KernelRequest) -> Exception:
    """What kernels' own resolver raised after kerneld failed, as the caller gets it.

    A repo that neither kerneld nor the Hub can provide (Transformers maps layers to repos a
    site may not have) must not fail a model load: `kernelize` keeps the PyTorch forward on a
    FileNotFoundError only, so for a layer's kernel a network or Hub error becomes
    KernelUnavailable (one). A direct `get_kernel` call gets kernels' own error, as without the
    hook; so do the kernel's own errors (kernels' trust ValueError, a failing import)."""
    if isinstance(err, FileNotFoundError) or not FOR_LAYER.get():
        return err
    transport = isinstance(err, OSError) or type(err).__module__.split(".")[0] in (
        _TRANSPORT_MODULES
    )
    if not transport:
        return err
    said = (str(err).splitlines() or [""])[0]
    return KernelUnavailable(
        f"kerneld could not provide it ({exc.message}), and the kernels package's own "
        f"resolver failed too ({type(err).__name__}: {said})",
        repo_id=req.repo_id,
        revision=req.ref,
    )


class Refused(Exception):
    """kernels' validators refused a kernel before kerneld imported it (carries their error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def validate_metadata(api: KernelsApi, validator: Any, folder: Path, variant: str) -> Any:
    """kernels' metadata validators (arch excepted: kerneld checks it itself); the metadata."""
    metadata = api.Metadata.read_from_file(folder / "metadata.json")
    if isinstance(validator, api.AllValidator):
        validator = api.AllValidator(
            validators=[v for v in validator.validators if not isinstance(v, api.ArchValidator)]
        )
    validator.validate_metadata(metadata=metadata, variant=variant)
    return metadata


def registered(
    api: KernelsApi, validator: Any, loaded: loader.LoadedKernel, metadata: Any = None
) -> Any:
    """The loaded kernel, in kernels' registry of loaded kernels. `metadata` is given when the
    validators passed it before this load's import; else (imported earlier in the process)
    they run now, as kernels validates on every load."""
    if metadata is None:
        metadata = validate_metadata(api, validator, loaded.path, loaded.variant)
    api.registry.setdefault(
        loaded.path,
        api.LoadedKernel(
            metadata=metadata,
            module=loaded.module,
            repo_info=api.RepoInfo(repo_id=loaded.repo_id, revision=loaded.commit),
        ),
    )
    return loaded.module


def note_newer_version(req: KernelRequest) -> None:
    """`kernels`' "version N is available" notice, on its own logger."""
    published.note_newer_version(req, "kernels._versions")
