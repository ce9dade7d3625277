"""Whether a hub layer class may stand in for an original layer's forward, in this mode.

Three questions `kernelize` asks of every kernel layer before binding it: is it a well-formed
replacement (the rules of `kernels`: an `nn.Module` subclass without a constructor or members of
its own, with a forward of the same shape), can it do what the mode asks (backward for
training, torch.compile), and does it declare itself deterministic (see the package docstring's
"Determinism convention"). Torch is imported only when a layer is actually checked.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from kerneld_client.layers._mode import Mode

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "ALLOWED_LAYER_MEMBERS",
    "METADATA_DETERMINISTIC",
    "InvalidKernelLayer",
    "NondeterministicKernel",
    "declared_deterministic",
    "mode_problem",
    "validated_layer",
]

#: Members a hub layer may add to `nn.Module` (`deterministic` is kerneld's addition).
ALLOWED_LAYER_MEMBERS = frozenset({"has_backward", "can_torch_compile", "deterministic"})
#: metadata.json key of the determinism declaration.
METADATA_DETERMINISTIC = "deterministic"


class InvalidKernelLayer(TypeError):
    """A hub layer cannot replace the original: not an `nn.Module`, has state or members of its
    own, or its `forward` signature differs."""

    def __init__(self, message: str, *, signature: bool = False) -> None:
        super().__init__(message)
        self.signature = signature


class NondeterministicKernel(RuntimeError):
    """Deterministic algorithms are on and the kernel layer is not declared deterministic."""


# ------------------------------------------------------------------------ a valid replacement


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


def validated_layer(layer: Any, original: type[Any], where: str) -> type[nn.Module]:
    """`layer`, once checked against `original` (each pair of classes is checked once per
    process); InvalidKernelLayer if it cannot replace it."""
    key = (layer, original) if isinstance(layer, type) else None
    if key is not None and key in _validated:
        return layer  # type: ignore[no-any-return]
    checked = _validate_layer(layer, original, where)
    if key is not None:
        _validated[key] = True
    return checked


# ------------------------------------------------------------------------ modes


def mode_problem(layer: type[Any], mode: Mode, repo: str) -> str | None:
    """Why `layer` cannot run in the kernelize `mode` (no backward for training, no torch.compile
    support), or None if it can. Only the mode asked for counts, not the modes the mapping entry
    was registered for: as in `kernels` 0.19, an entry registered for training whose layer has
    no backward is a fallback (under `KernelizeFallback.NO_COMPATIBLE_MODE`), not an error."""
    if Mode.TRAINING in mode and not getattr(layer, "has_backward", True):
        return (
            f"Function/layer from repo {repo} does not support backward, needed for mode "
            f"`{mode}` (the kernel layer declares has_backward=False)"
        )
    if Mode.TORCH_COMPILE in mode and not getattr(layer, "can_torch_compile", False):
        return (
            f"Function/layer from repo {repo} does not support torch.compile, needed for mode "
            f"`{mode}` (the kernel layer does not declare can_torch_compile=True)"
        )
    return None


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
