"""What the example-kernel tests share: PyTorch references for the ops, the variant kinds and
shapes they run over, and importing a built variant the way `kernels` does."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import torch
import torch.nn.functional as F

from examples.kernels.built import BuiltExamples, BuiltVariant

KINDS = ("arch", "torch-cpu", "torch-universal")
DTYPES = (torch.float32, torch.bfloat16)
GATED_SHAPES = ((1, 2), (3, 16), (2, 3, 34), (0, 8), (5, 4, 2, 6))
NORM_SHAPES = ((1, 1), (3, 16), (2, 3, 33), (0, 8))
EPS = 1e-6


def tol(dtype: torch.dtype) -> dict[str, float]:
    # bf16: the kernels round once from float, PyTorch's reference rounds after each op.
    return {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}


def ref_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def ref_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def ref_gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def ref_relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def ref_relu2_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.relu(x[..., :d]).square() * x[..., d:]


GATED_REFS = {
    "silu_and_mul": ref_silu_and_mul,
    "gelu_tanh_and_mul": ref_gelu_tanh_and_mul,
    "gelu_and_mul": ref_gelu_and_mul,
    "relu2_and_mul": ref_relu2_and_mul,
}


def import_variant(variant: BuiltVariant) -> ModuleType:
    """Import a variant the way `kernels` does: under its metadata id, with relative imports."""
    if variant.module_id in sys.modules:
        return sys.modules[variant.module_id]
    spec = importlib.util.spec_from_file_location(
        variant.module_id, variant.init_file, submodule_search_locations=[str(variant.path)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[variant.module_id] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(variant.module_id, None)
        raise
    return module


def pick(built: BuiltExamples, kind: str, version: int, kernel: str = "activation") -> BuiltVariant:
    return built.variant(kernel, version, None if kind == "arch" else kind)
