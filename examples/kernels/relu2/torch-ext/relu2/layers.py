"""Hub layer of the relu2 kernel (`kernels` style: stateless, forward only)."""

import torch
from torch import nn

from ._ops import ops


class ReLU2(nn.Module):
    has_backward = False
    can_torch_compile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        ops.relu2(out, x)
        return out


__all__ = ["ReLU2"]
