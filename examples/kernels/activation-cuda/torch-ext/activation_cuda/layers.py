"""Hub layers of the activation-cuda kernel, in the `kernels` style (see activation/layers.py).

The ops run on CUDA tensors only; `kernels`' device mapping picks these layers for `cuda` and
keeps PyTorch's forward elsewhere.
"""

import torch
from torch import nn

from ._ops import ops


class SiluAndMul(nn.Module):
    has_backward = False
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
        ops.silu_and_mul(out, x.contiguous())
        return out


class RMSNorm(nn.Module):
    weight: torch.Tensor
    variance_epsilon: float

    has_backward = False
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.contiguous()
        out = torch.empty_like(x)
        weight = self.weight.to(x.dtype).contiguous()
        ops.rms_norm(out, x, weight, float(self.variance_epsilon))
        return out


__all__ = ["RMSNorm", "SiluAndMul"]
