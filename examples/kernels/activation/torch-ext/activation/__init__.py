"""Activation example kernel: elementwise and gated activations, and RMSNorm.

Functions follow the kernels-community convention: `op(out, x)` fills `out` and returns it;
`op_alloc(x)` allocates the output. The package is imported under its build's metadata id, which
is also its op namespace, so only relative imports are used. `_ops.py` and `_version.py` are
written by examples/kernels/build.py.
"""

import torch

from . import layers
from ._ops import add_op_namespace_prefix, ops
from ._version import KERNEL_VERSION, __version__


def _gated_out(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ops.silu_and_mul(out, x)
    return out


def gelu_tanh_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ops.gelu_tanh_and_mul(out, x)
    return out


def rms_norm(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> torch.Tensor:
    ops.rms_norm(out, x, weight, epsilon)
    return out


def silu(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ops.silu(out, x)
    return out


def gelu_tanh(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ops.gelu_tanh(out, x)
    return out


def silu_and_mul_alloc(x: torch.Tensor) -> torch.Tensor:
    return silu_and_mul(_gated_out(x), x)


def gelu_tanh_and_mul_alloc(x: torch.Tensor) -> torch.Tensor:
    return gelu_tanh_and_mul(_gated_out(x), x)


def rms_norm_alloc(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    return rms_norm(torch.empty_like(x), x, weight, epsilon)


__all__ = [
    "KERNEL_VERSION",
    "__version__",
    "add_op_namespace_prefix",
    "gelu_tanh",
    "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_alloc",
    "layers",
    "ops",
    "rms_norm",
    "rms_norm_alloc",
    "silu",
    "silu_and_mul",
    "silu_and_mul_alloc",
]

if KERNEL_VERSION >= 2:
    # v2 adds the exact (erf) GELU: the observable difference between the v1 and v2 branches.

    def gelu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ops.gelu_and_mul(out, x)
        return out

    def gelu_and_mul_alloc(x: torch.Tensor) -> torch.Tensor:
        return gelu_and_mul(_gated_out(x), x)

    __all__ += ["gelu_and_mul", "gelu_and_mul_alloc"]
