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

This module is the run itself: the order of the decisions for each instance, and what each
outcome does to the instance and the report. What it asks along the way lives beside it:
`_mapping` (which repo), `_repos` (the kernel), `_layer_checks` (may this layer replace that
forward), `_disable` (KERNELD_DISABLE), `_causes` (what the report calls a failure) and
`_swap` (binding and restoring `forward`, the last report of each model).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kerneld_client import _config
from kerneld_client.layers._causes import (
    MISS_CAUSES,
    Failure,
    classify,
    is_configuration_error,
)
from kerneld_client.layers._device import Device, coerce_device
from kerneld_client.layers._disable import DisableRule, disable_rules
from kerneld_client.layers._layer_checks import (
    NondeterministicKernel,
    declared_deterministic,
    mode_problem,
    validated_layer,
)
from kerneld_client.layers._mapping import MappingMiss, select_repository
from kerneld_client.layers._marks import CONDITION_ATTR, LAYER_NAME_ATTR
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
from kerneld_client.layers._swap import install_forward, marked, remember_report, restore_forward

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "ENV_ALLOW_NONDETERMINISTIC",
    "ENV_DISABLE",
    "ENV_DISABLE_KERNEL_MAPPING",
    "kernelize",
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


# ------------------------------------------------------------------------ one kernelize run


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
        self.rules = disable_rules()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.warn_only = (
            self.deterministic and torch.is_deterministic_algorithms_warn_only_enabled()
        )
        self.allow_nondeterministic = allow_nondeterministic
        self.entries: list[LayerReport] = []
        self.failures: dict[Hashable, Failure] = {}

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
        restore_forward(module)
        self.entries.append(replace(base, status=status, cause=cause, reason=reason))

    def _failure(self, key: Hashable, exc: BaseException) -> Failure:
        cause, reason = classify(exc)
        failure = Failure(cause, reason, exc)
        self.failures[key] = failure
        return failure

    # -- obtaining the layer class

    def _obtain(
        self, repo: Any, original: type[Any]
    ) -> tuple[type[nn.Module], KernelSource | None] | Failure:
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
            return validated_layer(layer, original, str(repo)), source
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
            # the record `kernels` writes (it has no report to put it in), on its logger when
            # the hook serves `kernels`
            logging.getLogger(_config.kernels_logger("kernelize", log.name)).info(
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
            cause, flag = MISS_CAUSES[miss.stage]
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
        if isinstance(obtained, Failure) and is_configuration_error(obtained.error):
            raise obtained.error
        if isinstance(obtained, Failure):
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
            # One warning per repository and process (the loader's hub fallback shares it).
            where = f"{base.repo}@{base.revision}" if base.revision else base.repo
            _config.warn_once(
                repo_id or base.repo,
                f"kerneld: kernel {where} cannot be loaded ({obtained.reason}); layer "
                f"`{layer_name}` keeps its PyTorch forward",
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

        problem = mode_problem(layer, self.mode, str(repo))
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
        install_forward(module, layer, repo)
        self.entries.append(
            replace(base, status=LayerStatus.KERNELIZED, cause=Cause.NONE, reason=note)
        )

    def _disabled(self, module: nn.Module, base: LayerReport, rule: DisableRule) -> None:
        self._keep(
            module,
            base,
            LayerStatus.DISABLED,
            Cause.KERNELD_DISABLE,
            f"{ENV_DISABLE} entry `{rule.raw}`",
            allowed_by=KernelizeFallback.ALL,
        )

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
    for name, module in list(marked(model)):
        run.layer(name, module)
    remember_report(model, run.finish())
    return model
