"""The attention functions, shared by the package's API and its hub layer."""

import math
from typing import Any

import torch

from ._ops import ops

#: Transformers checks for this name (with `flash_attn_forward`) before it registers the kernel's
#: `flash_attn_forward` as an attention function.
supports_flash_attn = True


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _unsupported(dropout_p: float, alibi_slopes: torch.Tensor | None) -> None:
    if dropout_p:
        raise NotImplementedError("the attention example runs inference only (dropout_p must be 0)")
    if alibi_slopes is not None:
        raise NotImplementedError("the attention example has no ALiBi (alibi_slopes must be None)")


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_size: tuple = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """The op on packed (total, heads, head_size) tensors; a new output tensor. The offsets
    go to q's device (the CUDA build reads them there, as flash-attn does)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device=q.device)
    ops.varlen_attention(
        out,
        q,
        k,
        v,
        cu_seqlens_q.to(device=q.device, dtype=torch.int64).contiguous(),
        cu_seqlens_k.to(device=q.device, dtype=torch.int64).contiguous(),
        float(softmax_scale),
        bool(causal),
        int(window_size[0]),
        int(window_size[1]),
        float(softcap or 0.0),
    )
    return out


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    softmax_scale: float,
    softcap: float = 0.0,
) -> torch.Tensor:
    """The op on (batch, heads, seq, head_size) tensors with a boolean mask broadcastable to
    (batch, heads, q_len, k_len), true where a key is seen; a new output tensor."""
    b, h, sq, _ = q.shape
    mask = mask.expand(b, h, sq, k.shape[2]).contiguous()
    out = torch.empty((b, h, sq, v.shape[3]), dtype=q.dtype, device=q.device)
    ops.masked_attention(
        out, q.contiguous(), k.contiguous(), v.contiguous(), mask, float(softmax_scale), softcap
    )
    return out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor:
    """flash-attn 2's `flash_attn_varlen_func` (the output only: no softmax statistics)."""
    del max_seqlen_q, max_seqlen_k, deterministic  # the loops need neither; always deterministic
    _unsupported(dropout_p, alibi_slopes)
    if return_attn_probs:
        raise NotImplementedError("the attention example returns no attention probabilities")
    return varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, _scale(q, softmax_scale), causal, window_size, softcap
    )


def _fa3_defaults(**extras: Any) -> None:
    """flash-attn 3's extra keywords (Diffusers' `_flash_3_hub` passes them all): accepted at
    the values that mean "plain attention" only."""
    plain = {"qv": None, "q_descale": None, "k_descale": None, "v_descale": None}
    plain.update(attention_chunk=0, num_splits=1, pack_gqa=None, sm_margin=0)
    odd = sorted(
        name
        for name, value in extras.items()
        if (value is not None if plain[name] is None else value != plain[name])
    )
    if odd:
        raise NotImplementedError(f"the attention example has no {', '.join(odd)}")


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    attention_chunk: int = 0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """flash-attn 2's `flash_attn_func`: q (batch, seqlen_q, heads, head_size). It also takes
    flash-attn 3's keywords (at their defaults), so one build stands in for both."""
    _fa3_defaults(
        qv=qv,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        attention_chunk=attention_chunk,
        num_splits=num_splits,
        pack_gqa=pack_gqa,
        sm_margin=sm_margin,
    )
    batch, sq = q.shape[0], q.shape[1]
    sk = k.shape[1]
    cu_q = torch.arange(0, (batch + 1) * sq, sq, dtype=torch.int64, device=q.device)
    cu_k = torch.arange(0, (batch + 1) * sk, sk, dtype=torch.int64, device=q.device)
    out = flash_attn_varlen_func(
        q.reshape(batch * sq, *q.shape[2:]),
        k.reshape(batch * sk, *k.shape[2:]),
        v.reshape(batch * sk, *v.shape[2:]),
        cu_q,
        cu_k,
        sq,
        sk,
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        deterministic=deterministic,
        return_attn_probs=return_attn_probs,
    )
    return out.reshape(batch, sq, *out.shape[1:])


def _seen(mask: torch.Tensor) -> torch.Tensor:
    """A boolean mask from Transformers' SDPA-style one: bool as is; an additive float mask of
    0 (seen) and its dtype's minimum (masked). A float mask carrying biases is refused."""
    if mask.dtype == torch.bool:
        return mask
    floor = torch.finfo(mask.dtype).min / 2
    seen = mask > floor
    if bool((mask[seen] != 0).any()):
        raise NotImplementedError("the attention example takes no additive attention biases")
    return seen


def flash_attn_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple:
    """Transformers' attention-function form (as its `sdpa_attention_forward`): query
    (batch, heads, q_len, head_size); returns ((batch, q_len, heads, head_size), None)."""
    del kwargs
    _unsupported(dropout, None)
    scale = _scale(query, scaling)
    if attention_mask is not None:
        out = masked_attention(query, key, value, _seen(attention_mask), scale, softcap or 0.0)
        return out.transpose(1, 2).contiguous(), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1
    window = (sliding_window - 1, -1) if sliding_window else (-1, -1)
    out = flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scale,
        causal=causal,
        window_size=window,
        softcap=softcap or 0.0,
    )
    return out, None


def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """SageAttention's `sageattn` (exact, not quantized): `tensor_layout` "HND" is (batch,
    heads, seq, head_size), "NHD" (batch, seq, heads, head_size), as flash-attn's."""
    del kwargs  # SageAttention's tuning knobs (pv_accum_dtype...): nothing to tune here
    if return_lse:
        raise NotImplementedError("the attention example returns no log-sum-exp")
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"tensor_layout must be 'HND' or 'NHD', not {tensor_layout!r}")
    if tensor_layout == "HND":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = flash_attn_func(q, k, v, softmax_scale=sm_scale, causal=is_causal)
    return out.transpose(1, 2) if tensor_layout == "HND" else out
