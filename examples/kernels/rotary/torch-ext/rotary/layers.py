"""Hub layer of the rotary kernel: a function kernel in layer form.

A function marked for kernels (`use_kernel_forward_from_hub` on a function) becomes an
`nn.Module` whose forward takes the function's parameters; the hub side is a stateless layer
with the same forward, named as the mapping names it (`apply_rotary_transformers`, the name the
kernels-community rotary kernel uses).
"""

import torch
from torch import nn

from . import _impl


# Lower case: the class is named as the mapping names the layer (a function name).
class apply_rotary_transformers(nn.Module):
    has_backward = False
    can_torch_compile = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _impl.apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim)


__all__ = ["apply_rotary_transformers"]
