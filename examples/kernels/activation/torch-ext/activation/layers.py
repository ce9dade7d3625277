"""Hub layers of the activation kernel, in the `kernels` style.

`kernels.kernelize` binds `forward` to the module it replaces, so a layer may only read that
module's attributes (RMSNorm: `weight`, `variance_epsilon`) and must not add members besides
`has_backward` and `can_torch_compile`. The compiled ops have no autograd formula, hence
`has_backward = False`: `kernels` keeps the original forward when training.
"""

import torch
from torch import nn

from ._ops import ops
from ._version import KERNEL_VERSION


class Silu(nn.Module):
    """Transformers' `SiLU` layer kind: elementwise, the output has the input's shape."""

    has_backward = False
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        ops.silu(out, x)
        return out


class GeluTanh(nn.Module):
    """Transformers' `GeluTanh` layer kind: elementwise tanh-approximated GELU."""

    has_backward = False
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        ops.gelu_tanh(out, x)
        return out


class SiluAndMul(nn.Module):
    has_backward = False
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
        ops.silu_and_mul(out, x)
        return out


class GeluTanhAndMul(nn.Module):
    has_backward = False
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
        ops.gelu_tanh_and_mul(out, x)
        return out


class RMSNorm(nn.Module):
    weight: torch.Tensor
    variance_epsilon: float

    has_backward = False
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(hidden_states)
        weight = self.weight.to(hidden_states.dtype)
        ops.rms_norm(out, hidden_states, weight, float(self.variance_epsilon))
        return out


__all__ = ["GeluTanh", "GeluTanhAndMul", "RMSNorm", "Silu", "SiluAndMul"]

if KERNEL_VERSION >= 2:

    class GeluAndMul(nn.Module):
        has_backward = False
        can_torch_compile = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
            ops.gelu_and_mul(out, x)
            return out

    __all__ += ["GeluAndMul"]
