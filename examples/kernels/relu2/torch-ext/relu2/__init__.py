"""Squared-ReLU example kernel: the second, smaller kernel with its own op namespace.

`relu2(out, x)` fills `out` with relu(x)**2 and returns it; `relu2_alloc(x)` allocates. v2 adds
`relu2_and_mul`. `_ops.py` and `_version.py` are written by examples/kernels/build.py.
"""

import torch

from . import layers
from ._ops import add_op_namespace_prefix, ops
from ._version import KERNEL_VERSION, __version__


def relu2(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ops.relu2(out, x)
    return out


def relu2_alloc(x: torch.Tensor) -> torch.Tensor:
    return relu2(torch.empty_like(x), x)


__all__ = [
    "KERNEL_VERSION",
    "__version__",
    "add_op_namespace_prefix",
    "layers",
    "ops",
    "relu2",
    "relu2_alloc",
]

if KERNEL_VERSION >= 2:

    def relu2_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ops.relu2_and_mul(out, x)
        return out

    def relu2_and_mul_alloc(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
        return relu2_and_mul(out, x)

    __all__ += ["relu2_and_mul", "relu2_and_mul_alloc"]
