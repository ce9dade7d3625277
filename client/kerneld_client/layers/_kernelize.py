"""`kernelize`: swap the forward of marked layers for kernel layers, with a real fallback.

For every layer instance marked with `use_kernel_forward_from_hub` (ours or `kernels`'), the
active mapping picks a repo for the device, capability and mode; the kernel is obtained through
the client (once per process per repo and revision), its layer class is validated against the
original class, checked for the mode and for determinism, and bound as that instance's
`forward`. Nothing is changed on the class, so `unkernelize(model)` (or another `kernelize`)
puts each instance back exactly as it was.

Whatever goes wrong (daemon down, kernel denied, no variant for this platform, a device arch
mismatch, unreadable metadata, an import error, a layer whose forward does not match) keeps the
layer's PyTorch forward, logs one warning per layer name, repo and cause, and is recorded in the
report (`kernelize_report(model)`). `use_fallback=False` raises instead; `KERNELD_REQUIRE=1`
raises for every kernel the mapping selects but that cannot be used (the `kernels` DEFAULT
policy), while layers no mapping entry applies to still stay on PyTorch.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from types import MethodType
from typing import TYPE_CHECKING, Any

from kerneld_client import _config
from kerneld_client.layers._decorators import CONDITION_ATTR, FUNCS_ATTR, LAYER_NAME_ATTR
from kerneld_client.layers._device import Device, coerce_device
from kerneld_client.layers._mapping import MappingMiss, select_repository
from kerneld_client.layers._mode import (
    MODE_FALLBACK_CHAINS,
    KernelizeFallback,
    Mode,
    coerce_fallback,
    coerce_mode,
)
from kerneld_client.layers._report import Cause, KernelizeReport, LayerReport, LayerStatus
from kerneld_client.layers._repos import (
    KernelSource,
    _Repository,
    kernel_source,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "ENV_ALLOW_NONDETERMINISTIC",
    "ENV_DISABLE",
    "ENV_DISABLE_KERNEL_MAPPING",
    "InvalidKernelLayer",
    "NondeterministicKernel",
    "kernelize",
    "kernelize_report",
    "unkernelize",
]

log = logging.getLogger("kerneld_client.layers")

# The variables kernelize reads (defined, with every other knob, in _config):
# DISABLE_KERNEL_MAPPING (`kernels`' switch: every marked layer keeps its original forward),
# KERNELD_DISABLE (a comma list of layer names and/or `org/name[@revision]` to keep on PyTorch),
# KERNELD_ALLOW_NONDETERMINISTIC (use kernels not declared deterministic even when
# deterministic algorithms are on).
ENV_DISABLE_KERNEL_MAPPING = _config.ENV_DISABLE_KERNEL_MAPPING
ENV_DISABLE = _config.ENV_DISABLE
ENV_ALLOW_NONDETERMINISTIC = _config.ENV_ALLOW_NONDETERMINISTIC

#: Members a hub layer may add to `nn.Module` (`deterministic` is kerneld's addition).
ALLOWED_LAYER_MEMBERS = frozenset({"has_backward", "can_torch_compile", "deterministic"})
#: metadata.json key of the determinism declaration.
METADATA_DETERMINISTIC = "deterministic"

_DENIED_REASON = "denied by the host administrator"


class InvalidKernelLayer(TypeError):
    """A hub layer cannot replace the original: not an `nn.Module`, has state or members of its
    own, or its `forward` signature differs."""

    def __init__(self, message: str, *, signature: bool = False) -> None:
        super().__init__(message)
        self.signature = signature


class NondeterministicKernel(RuntimeError):
    """Deterministic algorithms are on and the kernel layer is not declared deterministic."""


# ------------------------------------------------------------------------ forward swapping


@dataclass(frozen=True)
class _Saved:
    """What an instance's `__dict__` said about `forward` before the first kernelize."""

    had_forward: bool
    forward: Any


#: Instance attribute (in `__dict__`) holding the `_Saved` state; it travels with
#: `copy.deepcopy`, so a copy of a kernelized model can be unkernelized too.
SAVED_ATTR = "_kerneld_saved_forward"

_reports: weakref.WeakKeyDictionary[Any, KernelizeReport] = weakref.WeakKeyDictionary()
_state_lock = threading.Lock()


def _install(module: nn.Module, layer: type[nn.Module]) -> None:
    state = module.__dict__
    if SAVED_ATTR not in state:
        state[SAVED_ATTR] = _Saved("forward" in state, state.get("forward"))
    state["forward"] = MethodType(layer.forward, module)


def _restore(module: nn.Module, *, forget: bool = False) -> None:
    state = module.__dict__
    saved = state.get(SAVED_ATTR)
    if not isinstance(saved, _Saved):
        return
    if saved.had_forward:
        state["forward"] = saved.forward
    else:
        state.pop("forward", None)
    if forget:
        del state[SAVED_ATTR]


def _marked(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """(name, module) for every marked module and attached function, each once."""
    seen: set[int] = set()
    for name, module in model.named_modules():
        for key, func in dict(module.__dict__.get(FUNCS_ATTR, {})).items():
            if id(func) not in seen:
                seen.add(id(func))
                yield (f"{name}.{key}" if name else key), func
        if hasattr(type(module), LAYER_NAME_ATTR) and id(module) not in seen:
            seen.add(id(module))
            yield (name or "<model>"), module


def unkernelize(model: nn.Module) -> nn.Module:
    """Put every layer instance `kernelize` touched back to its own forward."""
    for _name, module in _marked(model):
        _restore(module, forget=True)
    with _state_lock:
        _reports.pop(model, None)
    return model


def kernelize_report(model: nn.Module) -> KernelizeReport | None:
    """The report of the last `kernelize` of `model` (None if never, or after `unkernelize`)."""
    with _state_lock:
        return _reports.get(model)


# ------------------------------------------------------------------------ validation


def _validate_layer(layer: Any, original: type[Any], where: str) -> type[nn.Module]:
    """Check that `layer` can stand in for `original.forward` (the rules of `kernels`): an
    `nn.Module` subclass without its own constructor or members beyond the declared flags, whose
    forward has as many parameters, of the same kinds, as the original's."""
    from torch import nn

    if not isinstance(layer, type) or not issubclass(layer, nn.Module):
        raise InvalidKernelLayer(f"{where}: `{layer!r}` is not a torch.nn.Module subclass")
    if layer.__init__ is not nn.Module.__init__:
        raise InvalidKernelLayer(f"{where}: the layer must not override nn.Module.__init__")
    module_members = {name for name, _ in inspect.getmembers(nn.Module)}
    extra = {name for name, _ in inspect.getmembers(layer)} - module_members
    if not extra <= ALLOWED_LAYER_MEMBERS:
        names = ", ".join(sorted(extra - ALLOWED_LAYER_MEMBERS))
        raise InvalidKernelLayer(
            f"{where}: the layer adds members ({names}); only "
            f"{', '.join(sorted(ALLOWED_LAYER_MEMBERS))} are allowed"
        )
    try:
        params = list(inspect.signature(layer.forward).parameters.values())
        ref = list(inspect.signature(original.forward).parameters.values())
    except (TypeError, ValueError) as exc:
        raise InvalidKernelLayer(f"{where}: cannot read forward signatures: {exc}") from exc
    if len(params) != len(ref):
        raise InvalidKernelLayer(
            f"{where}: forward takes {len(params)} parameters, `{original.__name__}.forward` "
            f"takes {len(ref)}",
            signature=True,
        )
    for mine, theirs in zip(params, ref, strict=True):
        if mine.kind != theirs.kind:
            raise InvalidKernelLayer(
                f"{where}: forward parameter `{mine.name}` is {mine.kind.description}, but "
                f"`{original.__name__}.forward` has `{theirs.name}` {theirs.kind.description}",
                signature=True,
            )
    return layer


_validated: dict[tuple[type[Any], type[Any]], bool] = {}


def _validated_layer(layer: Any, original: type[Any], where: str) -> type[nn.Module]:
    key = (layer, original) if isinstance(layer, type) else None
    if key is not None and key in _validated:
        return layer  # type: ignore[no-any-return]
    checked = _validate_layer(layer, original, where)
    if key is not None:
        _validated[key] = True
    return checked


# ------------------------------------------------------------------------ determinism


def declared_deterministic(
    layer: type[Any], metadata: dict[str, Any] | Any, hub_layer: str
) -> tuple[bool, str]:
    """Whether a kernel layer declares itself deterministic, and where that came from.

    The layer class attribute `deterministic` (a bool) wins; else metadata.json `deterministic`:
    `true`/`false` for every layer of the build, or a list of the layer names that are.
    """
    attr = getattr(layer, "deterministic", None)
    if isinstance(attr, bool):
        return attr, f"layer attribute deterministic={attr}"
    value = metadata.get(METADATA_DETERMINISTIC) if hasattr(metadata, "get") else None
    if isinstance(value, bool):
        return value, f'metadata.json "deterministic": {str(value).lower()}'
    if isinstance(value, list):
        listed = hub_layer in value
        verb = "lists" if listed else "does not list"
        return listed, f'metadata.json "deterministic" {verb} `{hub_layer}`'
    return False, "the kernel does not declare itself deterministic"


# ------------------------------------------------------------------------ KERNELD_DISABLE


@dataclass(frozen=True)
class _DisableRule:
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


def _disable_rules() -> list[_DisableRule]:
    rules = []
    for raw in _config.raw(ENV_DISABLE).split(","):
        entry = raw.strip()
        if not entry:
            continue
        if "/" in entry:
            repo, _, revision = entry.partition("@")
            rules.append(_DisableRule(entry, repo=repo.strip(), revision=revision.strip() or None))
        else:
            rules.append(_DisableRule(entry, layer=entry))
    return rules


# ------------------------------------------------------------------------ one kernelize run


@dataclass(frozen=True)
class _Failure:
    cause: Cause
    reason: str
    error: BaseException


def _classify(exc: BaseException) -> tuple[Cause, str]:
    """The report cause and reason of an exception raised while obtaining a kernel layer."""
    from kerneld_client import errors
    from kerneld_client.lockfile import LockfileError

    text = str(exc) or type(exc).__name__
    if isinstance(exc, errors.KernelDenied):
        detail = exc.message if exc.message else ""
        return Cause.DENIED, f"{_DENIED_REASON} ({detail})" if detail else _DENIED_REASON
    table: tuple[tuple[type[BaseException], Cause], ...] = (
        (errors.DaemonUnavailable, Cause.DAEMON_UNAVAILABLE),
        (errors.NoCompatibleVariant, Cause.NO_COMPATIBLE_VARIANT),
        (errors.KernelNotFound, Cause.NOT_FOUND),
        (errors.KernelUnavailable, Cause.UNAVAILABLE),
        (errors.UntrustedPath, Cause.UNTRUSTED_PATH),
        (errors.KernelLoadError, Cause.LOAD_ERROR),
        (LockfileError, Cause.LOCKFILE),
        (ImportError, Cause.LOAD_ERROR),
        (FileNotFoundError, Cause.NOT_FOUND),
        (ConnectionError, Cause.DAEMON_UNAVAILABLE),
    )
    if isinstance(exc, InvalidKernelLayer):
        return (Cause.SIGNATURE_MISMATCH if exc.signature else Cause.INVALID_LAYER), text
    for kind, cause in table:
        if isinstance(exc, kind):
            return cause, text
    return Cause.ERROR, f"{type(exc).__name__}: {text}"


def _is_configuration_error(exc: BaseException) -> bool:
    """An error no fallback can make right (a version the repo does not have): `kernelize`
    raises it whatever `use_fallback` says, as `kernels` does."""
    from kerneld_client.errors import VersionNotFound

    return isinstance(exc, VersionNotFound)


def _check_registration(layer: type[Any], repo_mode: Mode, layer_name: str, repo: str) -> None:
    """A mapping entry registered for training or torch.compile whose kernel layer cannot do
    that is a configuration error: ValueError whatever `use_fallback` says (as in `kernels`)."""
    if Mode.TRAINING in repo_mode and not getattr(layer, "has_backward", True):
        raise ValueError(
            f"Function/layer from repo {repo} does not support backward.\n"
            f"Was registered for `{layer_name}` with mode `{repo_mode}`"
        )
    if Mode.TORCH_COMPILE in repo_mode and not getattr(layer, "can_torch_compile", False):
        raise ValueError(
            f"Function/layer from repo {repo} does not support torch.compile.\n"
            f"Was registered for `{layer_name}` with mode `{repo_mode}`"
        )


_MISS_CAUSES = {
    "no-mapping": (Cause.NO_MAPPING, KernelizeFallback.NO_LAYER),
    "no-device": (Cause.NO_DEVICE, KernelizeFallback.NO_DEVICE),
    "no-compatible-properties": (
        Cause.NO_COMPATIBLE_PROPERTIES,
        KernelizeFallback.NO_COMPATIBLE_PROPERTIES,
    ),
    "no-compatible-mode": (Cause.NO_COMPATIBLE_MODE, KernelizeFallback.NO_COMPATIBLE_MODE),
}


class _Run:
    """State of one `kernelize` call: policy, per-call failure memo, report entries."""

    def __init__(
        self,
        *,
        mode: Mode,
        device: Device,
        policy: KernelizeFallback,
        allow_nondeterministic: bool,
    ) -> None:
        import torch

        self.mode = mode
        self.device = device
        self.backend = "cpu" if device.type == "cpu" else None
        self.policy = policy
        self.disable_all = _config.flag(ENV_DISABLE_KERNEL_MAPPING)
        self.rules = _disable_rules()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.warn_only = (
            self.deterministic and torch.is_deterministic_algorithms_warn_only_enabled()
        )
        self.allow_nondeterministic = allow_nondeterministic
        self.entries: list[LayerReport] = []
        self.failures: dict[Hashable, _Failure] = {}

    # -- outcomes

    def _keep(
        self,
        module: nn.Module,
        base: LayerReport,
        status: LayerStatus,
        cause: Cause,
        reason: str,
        *,
        allowed_by: KernelizeFallback,
        error: BaseException | None = None,
    ) -> None:
        """Keep the PyTorch forward, or raise when the policy does not allow this fallback."""
        deliberate = status in (LayerStatus.DISABLED, LayerStatus.SKIPPED)
        if not deliberate and allowed_by not in self.policy:
            if error is not None:
                raise error
            raise ValueError(f"layer `{base.layer_name}` ({base.name}): {reason}")
        _restore(module)
        self.entries.append(replace(base, status=status, cause=cause, reason=reason))

    def _failure(self, key: Hashable, exc: BaseException) -> _Failure:
        cause, reason = _classify(exc)
        failure = _Failure(cause, reason, exc)
        self.failures[key] = failure
        return failure

    # -- obtaining the layer class

    def _obtain(
        self, repo: Any, original: type[Any]
    ) -> tuple[type[nn.Module], KernelSource | None] | _Failure:
        """The validated hub layer class of `repo` for `original`, or the failure (memoised
        for this call, so 48 instances of a layer with a dead daemon cost one attempt)."""
        layer_name = str(getattr(repo, "layer_name", "?"))
        if isinstance(repo, _Repository):
            early: Hashable = ("key", id(repo))
            if early in self.failures:
                return self.failures[early]
            try:
                kernel_key: Hashable = repo.cache_key(self.backend)
            except Exception as exc:
                return self._failure(early, exc)
            key: Hashable = (kernel_key, layer_name, original)
        else:
            kernel_key = key = ("foreign", repo, original)
        if kernel_key in self.failures:
            return self.failures[kernel_key]
        if key in self.failures:
            return self.failures[key]
        source: KernelSource | None = None
        try:
            if isinstance(repo, _Repository):
                source = kernel_source(repo, self.backend)
        except Exception as exc:
            return self._failure(kernel_key, exc)
        try:
            if source is not None:
                layer: Any = repo.layer_class(source)
            else:
                layer = repo.load()
            return _validated_layer(layer, original, str(repo)), source
        except Exception as exc:
            return self._failure(key, exc)

    # -- one layer instance

    def layer(self, name: str, module: nn.Module) -> None:
        cls = type(module)
        layer_name = str(getattr(cls, LAYER_NAME_ATTR))
        base = LayerReport(
            name=name,
            layer_name=layer_name,
            module_class=cls.__qualname__,
            status=LayerStatus.FALLBACK,
        )
        condition = getattr(cls, CONDITION_ATTR, None)
        if condition is not None and not condition(module):
            log.info(  # the record `kernels` writes (it has no report to put it in)
                "Skipping kernelization for `%s` using `%s` due to kernel_condition.",
                cls.__name__,
                layer_name,
            )
            self._keep(
                module,
                base,
                LayerStatus.SKIPPED,
                Cause.CONDITION,
                "the layer's kernel condition returned False for this instance",
                allowed_by=KernelizeFallback.ALL,
            )
            return
        if self.disable_all:
            self._keep(
                module,
                base,
                LayerStatus.DISABLED,
                Cause.DISABLE_KERNEL_MAPPING,
                f"{ENV_DISABLE_KERNEL_MAPPING}=1",
                allowed_by=KernelizeFallback.ALL,
            )
            return
        for rule in self.rules:
            if rule.matches_layer([layer_name]):
                self._disabled(module, base, rule)
                return
        try:
            selection = select_repository(layer_name, self.device, self.mode)
        except MappingMiss as miss:
            cause, flag = _MISS_CAUSES[miss.stage]
            self._keep(module, base, LayerStatus.UNMAPPED, cause, miss.message, allowed_by=flag)
            return
        repo = selection.repo
        if isinstance(repo, _Repository):
            repo_text, revision = repo.describe()
        else:
            repo_text, revision = str(repo), ""
        hub_layer = str(getattr(repo, "layer_name", ""))
        base = replace(
            base,
            repo=repo_text,
            revision=revision,
            hub_layer=hub_layer,
            repo_mode=str(selection.repo_mode).removeprefix("Mode."),
        )
        repo_id, refs = repo.disable_ids() if isinstance(repo, _Repository) else (None, frozenset())
        for rule in self.rules:
            if rule.matches_layer([hub_layer]) or rule.matches_repo(repo_id, refs):
                self._disabled(module, base, rule)
                return

        obtained = self._obtain(repo, cls)
        if isinstance(obtained, _Failure) and _is_configuration_error(obtained.error):
            raise obtained.error
        if isinstance(obtained, _Failure):
            if isinstance(repo, _Repository):  # a lock file read during loading names the pin
                base = replace(base, revision=repo.describe()[1])
            self._keep(
                module,
                base,
                LayerStatus.FALLBACK,
                obtained.cause,
                obtained.reason,
                allowed_by=KernelizeFallback.CANNOT_LOAD,
                error=obtained.error,
            )
            return
        layer, source = obtained
        if source is not None:
            base = replace(
                base,
                revision=source.revision,
                commit=source.commit,
                variant=source.variant,
                provenance=source.provenance,
            )
            if source.commit:
                for rule in self.rules:
                    if rule.matches_repo(repo_id, {source.commit}):
                        self._disabled(module, base, rule)
                        return

        _check_registration(layer, selection.repo_mode, layer_name, str(repo))
        problem = self._mode_problem(layer, selection.repo_mode)
        if problem is not None:
            self._keep(
                module,
                base,
                LayerStatus.FALLBACK,
                Cause.MODE_UNSUPPORTED,
                problem,
                allowed_by=KernelizeFallback.NO_COMPATIBLE_MODE,
            )
            return

        note = ""
        if self.deterministic and not self.allow_nondeterministic:
            metadata = source.metadata if source is not None else {}
            ok, why = declared_deterministic(layer, metadata, hub_layer)
            if not ok and not self.warn_only:
                reason = (
                    f"deterministic algorithms are enabled and {why}; set "
                    f"{ENV_ALLOW_NONDETERMINISTIC}=1 or kernelize(..., "
                    "allow_nondeterministic=True) to use it anyway"
                )
                self._keep(
                    module,
                    base,
                    LayerStatus.FALLBACK,
                    Cause.NONDETERMINISTIC,
                    reason,
                    allowed_by=KernelizeFallback.CANNOT_LOAD,
                    error=NondeterministicKernel(f"{base.name} ({repo}): {reason}"),
                )
                return
            if not ok:
                note = f"used in deterministic warn-only mode although {why}"
        _install(module, layer)
        self.entries.append(
            replace(base, status=LayerStatus.KERNELIZED, cause=Cause.NONE, reason=note)
        )

    def _disabled(self, module: nn.Module, base: LayerReport, rule: _DisableRule) -> None:
        self._keep(
            module,
            base,
            LayerStatus.DISABLED,
            Cause.KERNELD_DISABLE,
            f"{ENV_DISABLE} entry `{rule.raw}`",
            allowed_by=KernelizeFallback.ALL,
        )

    def _mode_problem(self, layer: type[Any], repo_mode: Mode) -> str | None:
        has_backward = bool(getattr(layer, "has_backward", True))
        can_compile = bool(getattr(layer, "can_torch_compile", False))
        wants_training = (Mode.TRAINING in self.mode) or (Mode.TRAINING in repo_mode)
        wants_compile = (Mode.TORCH_COMPILE in self.mode) or (Mode.TORCH_COMPILE in repo_mode)
        if wants_training and not has_backward:
            return (
                f"Available kernel does not support mode: {self.mode} (the kernel layer "
                f"declares has_backward=False; mapping entry {repo_mode})"
            )
        if wants_compile and not can_compile:
            return (
                f"Available kernel does not support mode: {self.mode} (the kernel layer does "
                f"not declare can_torch_compile=True; mapping entry {repo_mode})"
            )
        return None

    # -- end of the run

    def finish(self) -> KernelizeReport:
        groups: dict[tuple[str, str, Cause, LayerStatus], list[LayerReport]] = {}
        for entry in self.entries:
            if entry.status is LayerStatus.KERNELIZED and not entry.reason:
                continue
            key = (entry.layer_name, entry.repo, entry.cause, entry.status)
            groups.setdefault(key, []).append(entry)
        for (layer_name, repo, _cause, status), entries in groups.items():
            names = ", ".join(e.name for e in entries[:4]) + (", ..." if len(entries) > 4 else "")
            count = f"{len(entries)} instance{'s' if len(entries) != 1 else ''}: {names}"
            first = entries[0]
            where = f" kernel {repo}" + (f"@{first.revision}" if first.revision else "")
            if status is LayerStatus.KERNELIZED:
                log.warning(
                    "kerneld: layer `%s` (%s) uses%s: %s", layer_name, count, where, first.reason
                )
            elif status is LayerStatus.FALLBACK:
                log.warning(
                    "kerneld: layer `%s` (%s) keeps its PyTorch forward;%s: %s",
                    layer_name,
                    count,
                    where if repo else "",
                    first.reason,
                )
            else:
                log.info(
                    "kerneld: layer `%s` (%s) keeps its PyTorch forward (%s): %s",
                    layer_name,
                    count,
                    status.value,
                    first.reason,
                )
        return KernelizeReport(
            mode=str(self.mode).removeprefix("Mode."),
            device=self.device.type,
            layers=tuple(self.entries),
        )


# ------------------------------------------------------------------------ public entry


_SUPPORTED_MODES = frozenset(MODE_FALLBACK_CHAINS)


def _model_device(model: nn.Module) -> Device:
    """The device type of the model's first parameter (`rocm` for a ROCm build's `cuda`)."""
    try:
        param = next(model.parameters())
    except StopIteration:
        raise ValueError(
            "Cannot determine model device, provide as `device` argument to `kernelize`."
        ) from None
    dev_type = param.device.type
    if dev_type == "cuda":
        import torch

        if getattr(torch.version, "hip", None) is not None:
            return Device("rocm")
    return Device(dev_type)


def _device_arg(model: nn.Module, device: str | torch.device | Device | Any | None) -> Device:
    if device is None:
        return _model_device(model)
    if isinstance(device, str):
        return Device(device)
    try:
        import torch

        if isinstance(device, torch.device):
            return Device(device.type)
    except ImportError:  # pragma: no cover - a model implies torch
        pass
    return coerce_device(device)


def kernelize(
    model: nn.Module,
    *,
    mode: Mode | Any,
    device: str | torch.device | Device | None = None,
    use_fallback: bool | KernelizeFallback | Any = True,
    allow_nondeterministic: bool | None = None,
) -> nn.Module:
    """Replace the forward of every marked layer instance in `model` with its kernel layer.

    `mode` must contain `Mode.INFERENCE` or `Mode.TRAINING` (optionally `| Mode.TORCH_COMPILE`).
    `device` defaults to the device of the model's first parameter. `use_fallback=True` keeps
    the PyTorch forward on any failure; False raises; a `KernelizeFallback` flag chooses per
    case. `allow_nondeterministic` (default: `KERNELD_ALLOW_NONDETERMINISTIC`) lets kernels that
    are not declared deterministic run while `torch.use_deterministic_algorithms(True)` is on.
    Returns `model`; `kernelize_report(model)` says what happened to each layer.
    """
    from kerneld_client import _config

    chosen = coerce_mode(mode)
    if chosen is Mode.FALLBACK:
        raise ValueError("Mode.FALLBACK can only be used to register kernel mappings.")
    if Mode.INFERENCE not in chosen and Mode.TRAINING not in chosen:
        raise ValueError("kernelize mode must contain Mode.INFERENCE or Mode.TRAINING.")
    if chosen not in _SUPPORTED_MODES:
        raise ValueError(f"Unsupported kernelize mode: {chosen}")
    policy = coerce_fallback(use_fallback)
    if _config.require():
        policy &= ~KernelizeFallback.CANNOT_LOAD
    if allow_nondeterministic is None:
        allow_nondeterministic = _config.flag(ENV_ALLOW_NONDETERMINISTIC)
    run = _Run(
        mode=chosen,
        device=_device_arg(model, device),
        policy=policy,
        allow_nondeterministic=allow_nondeterministic,
    )
    for name, module in list(_marked(model)):
        run.layer(name, module)
    report = run.finish()
    with _state_lock:
        _reports[model] = report
    return model
