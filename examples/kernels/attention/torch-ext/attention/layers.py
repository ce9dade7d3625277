"""Hub layer of the attention kernel: flash-attn's function as a stateless layer (a function
kernel, as the kernels-community attention kernels also export layers)."""

import torch
from torch import nn

from . import _impl


class FlashAttention(nn.Module):
    """`flash_attn_func(q, k, v, ...)` as a layer: q (batch, seqlen, heads, head_size)."""

    has_backward = False
    can_torch_compile = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        return _impl.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal)


__all__ = ["FlashAttention"]
