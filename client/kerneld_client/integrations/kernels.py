"""Make the `kernels` package load Hub kernels through kerneld, so code written for it, and
Transformers' `from_pretrained(..., use_kernels=True)`, get one download per host, a zero-network
warm start, the verified store and node-wide denies without changing a line.

    from kerneld_client.integrations import kernels as kerneld_kernels
    kerneld_kernels.install()          # or KERNELD_HOOK_KERNELS=1 before the interpreter starts

Where it hooks (kernels >=0.17.2,<0.18, checked; anything else: one warning, no hook):
- `get_kernel_with_resolver` in `kernels.load`, `kernels.layer.layer` and `kernels.layer.func`:
  every Hub load funnels through it (get_kernel, get_locked_kernel, load_kernel,
  LayerRepository/FuncRepository loads, LockedLayerRepository/LockedFuncRepository);
- `select_revision_or_version` in `kernels.layer.layer` and `kernels.layer.func`: how a
  LayerRepository turns `version=N` into a commit (a Hub refs request in `kernels`);
- `has_kernel` (public names in `kernels` and `kernels.load`: it has no inner funnel, so a caller
  that bound it before install() keeps the original).
The first two are module globals looked up at call time: callers that imported `kernels.get_kernel`
before the hook (Transformers does) are routed too, and kernels' own layer machinery (mappings,
modes, `kernelize` fallbacks) is untouched. Local kernels (`LOCAL_KERNELS`, `get_local_kernel`,
`LocalLayerRepository`) and resolvers this module does not know stay with `kernels`.

A routed load is what `kerneld_client.get_kernel` does (published index, else the daemon; store
trust checks; arch check before import; kernel-depends; bytecode never written into the store),
then kernels' own metadata validators (python-depends, kernels_minver, dirty build; the arch one
excepted, kerneld did it) and registration in `kernels.get_loaded_kernels()`. Publisher trust is
the daemon's (`[trust]`, the same rule as kernels'): the call's `trust_remote_code` goes with the
request, and a refusal is kernels' own `ValueError`.

When kerneld cannot provide the kernel, $KERNELD_FALLBACK decides (one KernelFallbackWarning per
repository and process):
- unset or `hub`: kernels' own code runs, unchanged (it may download from the Hub); if it fails
  on the network or the Hub too, KernelUnavailable (so a layer mapped to a repo nobody has keeps
  PyTorch instead of failing the model load);
- `torch`: KernelUnavailable (a FileNotFoundError: `kernelize` keeps the PyTorch forward, and
  nothing touches the Hub);
- `error`, or KERNELD_REQUIRE=1: the typed error.
A kernel the administrator denied, or that has no build for this platform, is never handed to
`kernels` (that would bypass the deny): KernelDenied / NoCompatibleVariant, both FileNotFoundError.
"""

from __future__ import annotations

import contextvars
import importlib
import re
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kerneld_client import _config, loader
from kerneld_client._config import FallbackPolicy
from kerneld_client._types import KernelRequest
from kerneld_client.errors import (
    KernelDenied,
    KernelError,
    KernelLoadError,
    KernelUnavailable,
    NoCompatibleVariant,
    UntrustedPublisher,
    VersionNotFound,
)
from kerneld_client.platform import platform_facts

__all__ = ["RECOGNISED", "KerneldHookWarning", "install", "installed", "uninstall"]

RECOGNISED = ">=0.17.2,<0.18"
"""The `kernels` versions whose internals this hook knows (0.17.2 is what it is tested with)."""
_LOWEST = (0, 17, 2)
_BELOW = (0, 18)

# (module, attribute) replaced by install(), and the factory of each replacement
_POINTS: tuple[tuple[str, str], ...] = (
    ("kernels.load", "get_kernel_with_resolver"),
    ("kernels.layer.layer", "get_kernel_with_resolver"),
    ("kernels.layer.func", "get_kernel_with_resolver"),
    ("kernels.layer.layer", "select_revision_or_version"),
    ("kernels.layer.func", "select_revision_or_version"),
    # Only the name the layer repositories call: a load for a layer (see _for_layer).
    ("kernels.layer.layer", "get_kernel"),
    ("kernels.layer.func", "get_kernel"),
    ("kernels.load", "has_kernel"),
    ("kernels", "has_kernel"),
)
_MARK = "_kerneld_hook"


class KerneldHookWarning(RuntimeWarning):
    """The hook was not installed; `kernels` works as usual, without kerneld."""


class _Api:
    """The parts of `kernels` the hook reads, looked up once (AttributeError: not as expected)."""

    def __init__(self) -> None:
        resolver = importlib.import_module("kernels.resolver")
        validate = importlib.import_module("kernels.validate")
        rust = importlib.import_module("kernels._rust")
        kimporter = importlib.import_module("kernels.importer")
        hf_hub = importlib.import_module("kernels.hf_hub")
        self.SequentialResolver: Any = resolver.SequentialResolver
        self.NoopResolver: Any = resolver.NoopResolver
        self.RepoPathsResolver: Any = resolver.RepoPathsResolver
        self.HubResolver: Any = resolver.HubResolver
        self.HubCacheResolver: Any = resolver.HubCacheResolver
        self.LockedHubResolver: Any = resolver.LockedHubResolver
        self.LockedHubCacheResolver: Any = resolver.LockedHubCacheResolver
        self.AllValidator: Any = validate.AllValidator
        self.ArchValidator: Any = validate.ArchValidator
        self.Version: Any = rust.KernelVersion.Version
        self.Revision: Any = rust.KernelVersion.Revision
        self.Metadata: Any = rust.Metadata
        self.LoadedKernel: Any = kimporter.LoadedKernel
        self.registry: dict[Path, Any] = kimporter._loaded_kernels
        self.RepoInfo: Any = hf_hub.RepoInfo


class _State:
    __slots__ = ("api", "originals")

    def __init__(self, api: _Api) -> None:
        self.api = api
        self.originals: dict[tuple[str, str], Any] = {}


_state: _State | None = None
_lock = threading.RLock()  # reentrant: `import kernels` below may run the start-up hook
_refused = False  # install() said no, with its one warning


def _refuse(message: str) -> bool:
    global _refused
    if not _refused:
        warnings.warn(message, KerneldHookWarning, stacklevel=3)
    _refused = True
    _config.log.debug("%s", message)
    return False


def recognised(version: str) -> bool:
    """Whether `version` (kernels.__version__) is in RECOGNISED."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return False
    parts = tuple(int(p) for p in match.groups())
    return _LOWEST <= parts < _BELOW


def installed() -> bool:
    """Whether `kernels` is routed through kerneld in this process."""
    return _state is not None


def install() -> bool:
    """Route the `kernels` package through kerneld in this process; True if it is (now or
    already). Never raises: an unknown `kernels` gets one KerneldHookWarning and no hook."""
    global _state
    with _lock:
        if _state is not None:
            return True
        try:
            import kernels
        except Exception as exc:
            return _refuse(f"kerneld: cannot import the kernels package ({exc!r}); nothing hooked")
        if _state is not None:  # that import ran the start-up hook, which installed it
            return True
        version = str(getattr(kernels, "__version__", "unknown"))
        if not recognised(version):
            return _refuse(
                f"kerneld: kernels {version} is not a version the kerneld hook knows "
                f"({RECOGNISED}); kernels works as usual, without kerneld"
            )
        try:
            api = _Api()
            modules = {name: importlib.import_module(name) for name, _ in _POINTS}
            state = _State(api)
            for name, attr in _POINTS:
                current = getattr(modules[name], attr)
                while getattr(current, _MARK, False):  # wrapped by a reloaded copy of this module
                    current = current.__wrapped__
                if not callable(current):
                    raise AttributeError(f"{name}.{attr} is not callable")
                state.originals[(name, attr)] = current
        except (ImportError, AttributeError) as exc:
            return _refuse(
                f"kerneld: kernels {version} does not look as the kerneld hook expects ({exc}); "
                "kernels works as usual, without kerneld"
            )
        # One wrapper per original, so `kernels.has_kernel is kernels.load.has_kernel` stays.
        wrappers: dict[int, Any] = {}
        for (name, attr), original in state.originals.items():
            if id(original) not in wrappers:
                wrappers[id(original)] = _FACTORIES[attr](original)
            setattr(modules[name], attr, wrappers[id(original)])
        _state = state
        _config.log.debug("kernels %s now resolves through kerneld", version)
        return True


def uninstall() -> None:
    """Give `kernels` its own functions back."""
    global _state
    with _lock:
        if _state is None:
            return
        for (name, attr), original in _state.originals.items():
            module = sys.modules.get(name)
            if module is not None and getattr(getattr(module, attr, None), _MARK, False):
                setattr(module, attr, original)
        _state = None


# ------------------------------------------------------------------------------- routing


class _Plan:
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


def _is_local(repo_id: str) -> bool:
    """LOCAL_KERNELS redirects this repo (or is malformed): `kernels` handles it."""
    try:
        return repo_id in loader._local_overrides()
    except ValueError:
        return True


def _arch_checked(api: _Api, validator: Any) -> bool:
    if isinstance(validator, api.AllValidator):
        return any(isinstance(v, api.ArchValidator) for v in validator.validators)
    return True


def _plan(api: _Api, kernel: Any, resolver: Any, validator: Any) -> _Plan | None:
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
                req = loader._request(kernel.repo_id, version.version, None)
            elif isinstance(version, api.Revision):
                req = loader._request(kernel.repo_id, None, version.revision)
            else:
                return None
            # HubCacheResolver is HF_HUB_OFFLINE: serve what the store has, download nothing.
            return _Plan(
                req,
                allow_fetch=isinstance(item, api.HubResolver),
                check_arch=check_arch,
                trust_remote_code=_trust(item),
            )
        if isinstance(item, api.LockedHubResolver | api.LockedHubCacheResolver):
            lock = item.kernel_locks.get(kernel)
            if lock is None:
                return None  # kernels raises its "not locked" error
            loader._request(kernel.repo_id, None, None, required=False)  # repo id syntax
            locks: dict[str, str] = {}
            for dep, dep_lock in item.kernel_locks.items():
                locks.setdefault(dep.repo_id, dep_lock.commit)
            locks[kernel.repo_id] = lock.commit
            return _Plan(
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


def _through_kerneld(
    plan: _Plan,
    backend: str | None,
    before_import: Callable[[Path, str], None] | None = None,
) -> loader.LoadedKernel:
    """kerneld_client's load with no fallback (typed errors), memoised like get_kernel."""
    module = loader._run(
        plan.request,
        backend=backend,
        opts=loader._Options(
            check_arch=plan.check_arch,
            allow_fetch=plan.allow_fetch,
            locks=plan.locks,
            trust_remote_code=plan.trust_remote_code,
            before_import=before_import,
        ),
        fallback=loader.MISSING,
        policy=FallbackPolicy.ERROR,
        hub_allowed=False,
    )
    for record in loader.loaded_kernels():
        if record.module is module:
            return record
    raise KernelLoadError("the loaded kernel is not registered", repo_id=plan.request.repo_id)


def _policy() -> str:
    """`kernels` (unset, `hub`), `torch` or `error` (also KERNELD_REQUIRE=1)."""
    if _config.require():
        return "error"
    raw = _config.raw(_config.ENV_FALLBACK).lower()
    return raw if raw in ("torch", "error") else "kernels"


def _fall_back(exc: KernelError, req: KernelRequest) -> None:
    """Return to let kernels' own code run, or raise what the caller gets instead."""
    what = f"{req.repo_id}@{req.ref}"
    policy = _policy()
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
_FOR_LAYER: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kerneld_for_layer", default=False
)


def _for_layer(original: Callable[..., Any]) -> Callable[..., Any]:
    """`get_kernel` as the layer repositories see it: the same call, marked as a layer load."""

    def get_kernel(*args: Any, **kwargs: Any) -> Any:
        token = _FOR_LAYER.set(True)
        try:
            return original(*args, **kwargs)
        finally:
            _FOR_LAYER.reset(token)

    return _mark(get_kernel, original)


def _cannot_be_had(err: Exception, exc: KernelError, req: KernelRequest) -> Exception:
    """What kernels' own resolver raised after kerneld failed, as the caller gets it.

    A repo that neither kerneld nor the Hub can provide (Transformers maps layers to repos a
    site may not have) must not fail a model load: `kernelize` keeps the PyTorch forward on a
    FileNotFoundError only, so for a layer's kernel a network or Hub error becomes
    KernelUnavailable (one). A direct `get_kernel` call gets kernels' own error, as without the
    hook; so do the kernel's own errors (kernels' trust ValueError, a failing import)."""
    if isinstance(err, FileNotFoundError) or not _FOR_LAYER.get():
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


class _Refused(Exception):
    """kernels' validators refused a kernel before kerneld imported it (carries their error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _validate(api: _Api, validator: Any, folder: Path, variant: str) -> Any:
    """kernels' metadata validators (arch excepted: kerneld checks it itself); the metadata."""
    metadata = api.Metadata.read_from_file(folder / "metadata.json")
    if isinstance(validator, api.AllValidator):
        validator = api.AllValidator(
            validators=[v for v in validator.validators if not isinstance(v, api.ArchValidator)]
        )
    validator.validate_metadata(metadata=metadata, variant=variant)
    return metadata


def _validated(api: _Api, validator: Any, loaded: loader.LoadedKernel, metadata: Any = None) -> Any:
    """The loaded kernel, in kernels' registry of loaded kernels. `metadata` is given when the
    validators passed it before this load's import; else (imported earlier in the process)
    they run now, as kernels validates on every load."""
    if metadata is None:
        metadata = _validate(api, validator, loaded.path, loaded.variant)
    api.registry.setdefault(
        loaded.path,
        api.LoadedKernel(
            metadata=metadata,
            module=loaded.module,
            repo_info=api.RepoInfo(repo_id=loaded.repo_id, revision=loaded.commit),
        ),
    )
    return loaded.module


def _note_newer_version(req: KernelRequest) -> None:
    """`kernels`' "version N is available" notice, on its own logger."""
    loader.note_newer_version(req, "kernels._versions")


def _mark(func: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Tag a replacement (uninstall() and a second install() recognise it) and copy the doc."""
    setattr(func, _MARK, True)
    func.__wrapped__ = original  # type: ignore[attr-defined]
    func.__doc__ = original.__doc__
    return func


def _get_kernel_with_resolver(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_kernel_with_resolver(
        *, api: Any, backend: str | None, kernel: Any, resolver: Any, metadata_validator: Any
    ) -> Any:
        def theirs() -> Any:
            return original(
                api=api,
                backend=backend,
                kernel=kernel,
                resolver=resolver,
                metadata_validator=metadata_validator,
            )

        state = _state
        if state is None:
            return theirs()
        try:
            plan = _plan(state.api, kernel, resolver, metadata_validator)
        except ValueError:  # a repo id or revision kerneld does not take: kernels decides
            plan = None
        if plan is None:
            return theirs()

        validated: dict[Path, Any] = {}  # folder -> its metadata, validated before import

        def before_import(folder: Path, variant: str) -> None:
            # As in kernels: a kernel its validators refuse (python-depends, kernels_minver)
            # never runs any code, here or in its dependencies.
            try:
                validated[folder] = _validate(state.api, metadata_validator, folder, variant)
            except Exception as exc:
                raise _Refused(exc) from exc

        try:
            loaded = _through_kerneld(plan, backend, before_import)
        except VersionNotFound:
            raise  # kernels' own ValueError for it, with the versions the repo has
        except UntrustedPublisher as exc:
            # kernels' own answer to an untrusted publisher: a ValueError, which its fallbacks
            # do not catch (the check must not turn into a silent PyTorch layer).
            raise ValueError(
                f"Kernel repository '{plan.request.repo_id}' is not from a trusted publisher "
                f"on this host ({exc.message}). Set trust_remote_code=True or add the "
                "repository ID to the trust_remote_code allowlist to allow loading kernels "
                "from untrusted sources."
            ) from exc
        except KernelError as exc:
            if isinstance(exc.__cause__, _Refused):  # kernels' own verdict, as kernels raises it
                raise exc.__cause__.error from None
            _fall_back(exc, plan.request)
            try:
                return theirs()
            except Exception as err:
                raise _cannot_be_had(err, exc, plan.request) from err
        except ValueError:  # e.g. a backend kerneld does not know: kernels decides
            return theirs()
        _note_newer_version(plan.request)
        return _validated(state.api, metadata_validator, loaded, validated.get(loaded.path))

    return _mark(get_kernel_with_resolver, original)


def _select_revision_or_version(original: Callable[..., Any]) -> Callable[..., Any]:
    def select_revision_or_version(
        repo_id: str, *, revision: str | None, version: int | None, local_files_only: bool
    ) -> Any:
        def theirs() -> Any:
            return original(
                repo_id, revision=revision, version=version, local_files_only=local_files_only
            )

        if _state is None or revision is not None or version is None or _is_local(repo_id):
            return theirs()
        try:
            req = loader._request(repo_id, version, None)
        except ValueError:
            return theirs()
        plan = _Plan(req, allow_fetch=not local_files_only, check_arch=True)
        try:
            commit = _through_kerneld(plan, None).commit
            _note_newer_version(req)
            return commit
        except VersionNotFound:
            # The repo has no such version: kernels' own ValueError, which fails the load as
            # it does without the hook (a mapping that can never be right).
            raise
        except KernelError as exc:
            # This runs inside `str(repo)` too, in a log line kernelize formats before its
            # fallback `try`: raising here would fail the model load. Whatever else goes wrong,
            # the branch name is answered, and the load that follows (inside that `try`) asks
            # again and fails where kernelize keeps the PyTorch forward.
            final = isinstance(exc, KernelDenied | NoCompatibleVariant)
            if _policy() != "kernels" or final:
                return req.ref
            _fall_back(exc, req)  # the one warning: kernels' own lookup follows
            try:
                return theirs()
            except ValueError:  # kernels' "Version N not found": final, as without the hook
                raise
            except Exception:
                return req.ref

    return _mark(select_revision_or_version, original)


def _has_kernel(original: Callable[..., Any]) -> Callable[..., Any]:
    def has_kernel(
        repo_id: str,
        *,
        revision: str | None = None,
        version: int | None = None,
        backend: str | None = None,
        trust_remote_code: bool | list[str] = False,
        check_arch: bool = True,
    ) -> bool:
        def theirs() -> bool:
            return bool(
                original(
                    repo_id,
                    revision=revision,
                    version=version,
                    backend=backend,
                    trust_remote_code=trust_remote_code,
                    check_arch=check_arch,
                )
            )

        if _state is None or _is_local(repo_id):
            return theirs()
        try:
            req = loader._request(repo_id, version, revision)
            facts = platform_facts(backend)
        except ValueError:
            return theirs()
        try:
            return loader._has_variant(req, facts, check_arch=check_arch)
        except (KernelDenied, NoCompatibleVariant):
            return False
        except KernelError as exc:
            try:
                _fall_back(exc, req)
            except FileNotFoundError:
                return False
            return theirs()

    return _mark(has_kernel, original)


_FACTORIES: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "get_kernel": _for_layer,
    "get_kernel_with_resolver": _get_kernel_with_resolver,
    "select_revision_or_version": _select_revision_or_version,
    "has_kernel": _has_kernel,
}
