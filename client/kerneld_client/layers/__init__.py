"""The layer API of the `kernels` package, served by kerneld: mark layers, map them to kernel
repos, `kernelize` a model, and always keep a working PyTorch model.

    from kerneld_client.layers import (
        LayerRepository, Mode, kernelize, kernelize_report, use_kernel_forward_from_hub,
        use_kernel_mapping,
    )

    @use_kernel_forward_from_hub("RMSNorm")
    class RMSNorm(nn.Module): ...

    with use_kernel_mapping({"RMSNorm": {"cuda": LayerRepository(
            "kernels-community/layer-norm", layer_name="RMSNorm", version=1)}}):
        kernelize(model, mode=Mode.INFERENCE)
    print(kernelize_report(model))

Names and meanings follow `kernels` 0.17 (`use_kernel_forward_from_hub`,
`replace_kernel_forward_from_hub`, `use_kernelized_func`, `register_kernel_mapping`,
`use_kernel_mapping`, `LayerRepository`, `LockedLayerRepository`, `LocalLayerRepository`,
`Device`, `CUDAProperties`, `ROCMProperties`, `Mode` and its fallback chains, `kernelize`), and
the marks are the same attributes, so models decorated for `kernels` work unchanged. Where kerneld
differs, it is on purpose:

- **Fallback that falls back.** With `use_fallback=True` (the default) *any* failure to obtain,
  validate or use a kernel layer keeps that layer's PyTorch forward, logs one warning per layer
  name, repo and cause, and is recorded: `kernelize_report(model)` lists every marked instance
  with its status (`kernelized`, `fallback`, `unmapped`, `disabled`, `skipped`), cause, reason,
  repo, revision, commit and variant. `use_fallback=False` raises (as `kernels` does with
  `KernelizeFallback.NONE`); `KERNELD_REQUIRE=1` raises for every mapped kernel that cannot be
  used, while layers that no mapping entry applies to stay on PyTorch. A mapping that can never
  be right raises whatever `use_fallback` says, as in `kernels`: a version the repo does not
  have (`VersionNotFound`, a `ValueError`). A kernel layer that cannot do the mode asked for
  (no backward for `Mode.TRAINING`, no `Mode.TORCH_COMPILE`) keeps PyTorch, as in `kernels`
  0.19, whatever modes its entry was registered for.
- **Kernel functions per instance.** A function marked with `use_kernel_forward_from_hub` and
  attached with `use_kernelized_func` is kernelized per model instance, as in `kernels` 0.19:
  each instance has its own wrapper of it, which copies and pickles with the model.
- **Reversible.** `forward` is replaced per instance, never on the class; `unkernelize(model)`
  restores every instance, and a later `kernelize` starts from the original forward.
- **Disabling.** `DISABLE_KERNEL_MAPPING=1` (read at each `kernelize`, not at import) keeps every
  layer on PyTorch. `KERNELD_DISABLE` is a comma list of layer names (the mapping's `RMSNorm`, or
  the hub layer's name) and repo ids, optionally `org/name@revision` (a ref such as `v1`, or a
  commit), whose layers stay on PyTorch. Kernels the host administrator denied on the daemon
  (`kerneldctl deny`) fall back with the reason "denied by the host administrator".
- **One resolution per kernel.** A kernel is obtained once per process per repo, revision and
  backend (`clear_kernel_cache()` forgets them), however many layer instances use it; a failure
  is remembered for the rest of the `kernelize` call.
- **Capabilities** of CUDA/ROCm devices come from `kerneld_client.platform.platform_facts()`
  (injectable with `set_platform_facts()` or `KERNELD_PLATFORM_JSON`); an entry without
  properties matches any device, including one whose capability is unknown.

Determinism convention
----------------------
While `torch.are_deterministic_algorithms_enabled()` is true when `kernelize` runs, a kernel layer
is used only if the kernel declares it deterministic, in one of two ways:

1. the hub layer class attribute `deterministic = True` (or `False`), which wins; or
2. the variant's `metadata.json` key `"deterministic"`: `true` / `false` for every layer of the
   build, or a list of the layer class names that are deterministic (`["RMSNorm"]`). This is the
   field the daemon reports as `KernelMetadata.deterministic`; `kernels` ignores the key, so
   kernels that set it still load there (whereas `kernels` refuses a layer with an extra class
   attribute, so prefer the metadata key for kernels meant for both loaders).

Anything else counts as "not declared": the layer keeps its PyTorch forward and the report's
cause is `nondeterministic`, unless the user opts in with `KERNELD_ALLOW_NONDETERMINISTIC=1` or
`kernelize(..., allow_nondeterministic=True)`. In warn-only mode
(`torch.use_deterministic_algorithms(True, warn_only=True)`) the kernel is used and a warning is
logged. The check happens at `kernelize` time: enable deterministic algorithms first. See
docs/determinism.md.

Importing this package imports neither torch, grpc, huggingface_hub nor kerneld; decorating a
class needs no torch, decorating a function does (it becomes an `nn.Module`).
"""

from kerneld_client.layers._decorators import (
    replace_kernel_forward_from_hub,
    use_kernel_forward_from_hub,
)
from kerneld_client.layers._device import CUDAProperties, Device, ROCMProperties
from kerneld_client.layers._funcs import (
    FuncRepository,
    LocalFuncRepository,
    LockedFuncRepository,
    use_kernel_func_from_hub,
)
from kerneld_client.layers._inspect import (
    KernelizedFunc,
    KernelizedLayer,
    KernelizedLayers,
    get_kernelized_layers,
)
from kerneld_client.layers._kernel_funcs import use_kernelized_func
from kerneld_client.layers._kernelize import (
    ENV_ALLOW_NONDETERMINISTIC,
    ENV_DISABLE,
    ENV_DISABLE_KERNEL_MAPPING,
    kernelize,
)
from kerneld_client.layers._layer_checks import (
    InvalidKernelLayer,
    NondeterministicKernel,
    declared_deterministic,
)
from kerneld_client.layers._mapping import register_kernel_mapping, use_kernel_mapping
from kerneld_client.layers._mode import KernelizeFallback, Mode
from kerneld_client.layers._report import (
    Cause,
    KernelizeReport,
    LayerReport,
    LayerStatus,
    LayerSummary,
)
from kerneld_client.layers._repos import (
    KernelSource,
    LayerRepository,
    LocalLayerRepository,
    LockedLayerRepository,
    clear_kernel_cache,
)
from kerneld_client.layers._swap import kernelize_report, unkernelize

__all__ = [
    "ENV_ALLOW_NONDETERMINISTIC",
    "ENV_DISABLE",
    "ENV_DISABLE_KERNEL_MAPPING",
    "CUDAProperties",
    "Cause",
    "Device",
    "FuncRepository",
    "InvalidKernelLayer",
    "KernelSource",
    "KernelizeFallback",
    "KernelizeReport",
    "KernelizedFunc",
    "KernelizedLayer",
    "KernelizedLayers",
    "LayerReport",
    "LayerRepository",
    "LayerStatus",
    "LayerSummary",
    "LocalFuncRepository",
    "LocalLayerRepository",
    "LockedFuncRepository",
    "LockedLayerRepository",
    "Mode",
    "NondeterministicKernel",
    "ROCMProperties",
    "clear_kernel_cache",
    "declared_deterministic",
    "get_kernelized_layers",
    "kernelize",
    "kernelize_report",
    "register_kernel_mapping",
    "replace_kernel_forward_from_hub",
    "unkernelize",
    "use_kernel_forward_from_hub",
    "use_kernel_func_from_hub",
    "use_kernel_mapping",
    "use_kernelized_func",
]
