"""activation-cuda example kernel: SiLU-and-mul and RMSNorm as CUDA ops (sm_80, sm_90).

Functions follow the kernels-community convention: `op(out, x)` fills `out` and returns it;
`op_alloc(x)` allocates the output. The package is imported under its build's metadata id, so
only relative imports are used. `_ops.py` and `_version.py` are written by
examples/kernels/cuda_build.py.
"""

import torch

from . import layers
from ._ops import add_op_namespace_prefix, ops
from ._version import KERNEL_VERSION, __version__


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ops.silu_and_mul(out, x)
    return out


def rms_norm(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> torch.Tensor:
    ops.rms_norm(out, x, weight, epsilon)
    return out


def silu_and_mul_alloc(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return silu_and_mul(torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device), x)


def rms_norm_alloc(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    return rms_norm(torch.empty_like(x), x, weight, epsilon)


__all__ = [
    "KERNEL_VERSION",
    "__version__",
    "add_op_namespace_prefix",
    "layers",
    "ops",
    "rms_norm",
    "rms_norm_alloc",
    "silu_and_mul",
    "silu_and_mul_alloc",
]
