"""Hub layers of the activation kernel's noarch variants.

Same classes as the compiled variant, computed with differentiable PyTorch ops, so these layers
declare `has_backward = True` and `can_torch_compile = True`.
"""

import torch
from torch import nn

from . import _torch_impl
from ._version import KERNEL_VERSION


class Silu(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _torch_impl.silu(x)


class GeluTanh(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _torch_impl.gelu_tanh(x)


class SiluAndMul(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _torch_impl.silu_and_mul(x)


class GeluTanhAndMul(nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _torch_impl.gelu_tanh_and_mul(x)


class RMSNorm(nn.Module):
    weight: torch.Tensor
    variance_epsilon: float

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _torch_impl.rms_norm(hidden_states, self.weight, float(self.variance_epsilon))


__all__ = ["GeluTanh", "GeluTanhAndMul", "RMSNorm", "Silu", "SiluAndMul"]

if KERNEL_VERSION >= 2:

    class GeluAndMul(nn.Module):
        has_backward = True
        can_torch_compile = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _torch_impl.gelu_and_mul(x)

    __all__ += ["GeluAndMul"]
