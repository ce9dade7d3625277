"""Attention example kernel: flash-attn's interface on CPU, a stand-in for the Hub's attention
kernels (kernels-community/flash-attn2 and the like). The same package is the Python side of
its CUDA build (attention-cuda: csrc/attention_kernels.cu registers the ops for CUDA).

- `flash_attn_func(q, k, v, ...)`: q (batch, seqlen_q, heads, head_size), k and v (batch,
  seqlen_k, kv_heads, head_size), as flash-attn 2's;
- `flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)`: packed sequences;
- `flash_attn_forward(module, query, key, value, attention_mask, ...)` and
  `supports_flash_attn`: the form Transformers registers as an attention function when a hub
  kernel has no `flash_attn_varlen_func` (its arguments and result are SDPA's);
- what Diffusers' hub backends look up: `flash_attn_interface` (its `_flash_attn_forward`...
  training entry points refuse), flash-attn 3's keywords on `flash_attn_func` (`_flash_3_hub`),
  and SageAttention's `sageattn(q, k, v, tensor_layout, is_causal, sm_scale)` (`sage_hub`).

Causal masks are aligned to the bottom right, as in flash-attn >= 2.1. Inference only: no
dropout, no backward. `_ops.py` and `_version.py` are written by examples/kernels/build.py.
"""

from . import flash_attn_interface, layers
from ._impl import (
    flash_attn_forward,
    flash_attn_func,
    flash_attn_varlen_func,
    masked_attention,
    sageattn,
    supports_flash_attn,
    varlen_attention,
)
from ._ops import add_op_namespace_prefix, ops
from ._version import KERNEL_VERSION, __version__

__all__ = [
    "KERNEL_VERSION",
    "__version__",
    "add_op_namespace_prefix",
    "flash_attn_forward",
    "flash_attn_func",
    "flash_attn_interface",
    "flash_attn_varlen_func",
    "layers",
    "masked_attention",
    "ops",
    "sageattn",
    "supports_flash_attn",
    "varlen_attention",
]
