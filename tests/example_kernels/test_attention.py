"""The attention example (issue 53): flash-attn's interface on CPU against PyTorch's SDPA, in
every form Transformers calls it (flash_attn_func, flash_attn_varlen_func with padded batches
packed, a decode step against a longer cache, and the flash_attn_forward form with a mask)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from examples.kernels.built import BuiltExamples
from tests.example_kernels.support import import_variant

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def attention(built_examples: BuiltExamples) -> ModuleType:
    return import_variant(built_examples.variant("attention", 1))


def _sdpa(q, k, v, *, causal: bool, mask=None, scale=None):
    """PyTorch's attention on flash layout (batch, seq, heads, dim), GQA expanded, with the
    causal diagonal aligned to the bottom right (flash-attn >= 2.1)."""
    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def _qkv(batch: int, sq: int, sk: int, heads: int, kv_heads: int, dtype: torch.dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, sq, heads, 16, generator=gen).to(dtype)
    k = torch.randn(batch, sk, kv_heads, 16, generator=gen).to(dtype)
    v = torch.randn(batch, sk, kv_heads, 16, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [(7, 7), (1, 9), (3, 8)])
def test_flash_attn_func_equals_sdpa(
    attention: ModuleType, dtype: torch.dtype, causal: bool, sq: int, sk: int
) -> None:
    q, k, v = _qkv(2, sq, sk, 4, 2, dtype)
    out = attention.flash_attn_func(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    want = _sdpa(q, k, v, causal=causal)
    assert torch.allclose(out.float(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_flash_attn_varlen_func_keeps_sequences_apart(attention: ModuleType) -> None:
    """Three sequences of 5, 2 and 4 tokens packed as Transformers unpads a padded batch: each
    equals its own attention, nothing leaks across."""
    lengths = [5, 2, 4]
    qs = [_qkv(1, n, n, 4, 2, torch.float32, seed=i) for i, n in enumerate(lengths)]
    packed = [torch.cat([x[j][0] for x in qs]) for j in range(3)]
    cu = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    out = attention.flash_attn_varlen_func(*packed, cu, cu, 5, 5, causal=True)
    parts = out.split(lengths)
    for (q, k, v), part in zip(qs, parts, strict=True):
        want = _sdpa(q, k, v, causal=True)[0]
        assert torch.allclose(part, want, atol=1e-5)


def test_window_and_softcap(attention: ModuleType) -> None:
    q, k, v = _qkv(1, 6, 6, 2, 2, torch.float32)
    out = attention.flash_attn_func(q, k, v, causal=True, window_size=(1, 0))
    seen = torch.ones(6, 6, dtype=torch.bool).tril().triu(-1)  # itself and one before
    assert torch.allclose(out, _sdpa(q, k, v, causal=False, mask=seen), atol=1e-5)
    capped = attention.flash_attn_func(q * 8, k, v, softcap=1.0)
    assert not torch.allclose(capped, attention.flash_attn_func(q * 8, k, v), atol=1e-3)


def test_flash_attn_forward_is_transformers_attention_form(attention: ModuleType) -> None:
    """(module, query, key, value, attention_mask, ...) in SDPA's (batch, heads, seq, dim)
    layout, returning ((batch, seq, heads, dim), None): with a padding mask (bool and additive)
    and without one (causal from the module)."""
    assert attention.supports_flash_attn is True
    q, k, v = (x.transpose(1, 2) for x in _qkv(2, 5, 5, 4, 2, torch.float32))
    module = torch.nn.Module()
    module.is_causal = True  # type: ignore[assignment]
    out, weights = attention.flash_attn_forward(module, q, k, v, None)
    want = _sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    assert weights is None and torch.allclose(out, want, atol=1e-5)
    mask = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 1, 5, 5).clone()
    mask[1, :, :, :2] = False  # the second row's first two tokens are padding
    mask[1, :, :2, 0] = True  # (a padded query still sees something, as Transformers arranges)
    out, _ = attention.flash_attn_forward(module, q, k, v, mask)
    want = _sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False, mask=mask)
    assert torch.allclose(out, want, atol=1e-5)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out2, _ = attention.flash_attn_forward(module, q, k, v, additive)
    assert torch.equal(out, out2)


def test_bad_input_is_a_clear_error(attention: ModuleType) -> None:
    q, k, v = _qkv(1, 3, 3, 3, 2, torch.float32)
    with pytest.raises(RuntimeError, match="multiple of key/value heads"):
        attention.flash_attn_func(q, k, v)
    q, k, v = _qkv(1, 3, 3, 2, 2, torch.float32)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        attention.flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="num_splits, qv"):
        attention.flash_attn_func(q, k, v, qv=q, num_splits=2)
    with pytest.raises(NotImplementedError, match="inference only"):
        attention.flash_attn_interface._flash_attn_forward(q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_the_forms_diffusers_hub_backends_call(attention: ModuleType, causal: bool) -> None:
    """Diffusers 0.42's `_flash_3_hub` (flash-attn 3's keywords, at their defaults) and
    `sage_hub` (`sageattn`, NHD and HND layouts) give SDPA's result; `flash_hub` and
    `flash_varlen_hub` find flash-attn's `flash_attn_interface` entry points."""
    q, k, v = _qkv(2, 5, 5, 4, 4, torch.float32)
    want = _sdpa(q, k, v, causal=causal, scale=0.3)
    fa3 = attention.flash_attn_func(
        q=q, k=k, v=v, softmax_scale=0.3, causal=causal, qv=None, q_descale=None,
        k_descale=None, v_descale=None, window_size=(-1, -1), softcap=0.0, num_splits=1,
        pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False,
    )  # fmt: skip
    assert torch.allclose(fa3, want, atol=1e-5)
    nhd = attention.sageattn(q=q, k=k, v=v, tensor_layout="NHD", is_causal=causal, sm_scale=0.3)
    assert torch.allclose(nhd, want, atol=1e-5)
    hnd = attention.sageattn(
        *(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal, sm_scale=0.3
    )
    assert torch.allclose(hnd.transpose(1, 2), want, atol=1e-5)
    names = ("_flash_attn_forward", "_flash_attn_backward", "_flash_attn_varlen_forward")
    assert all(callable(getattr(attention.flash_attn_interface, n)) for n in names)
    with pytest.raises(ValueError, match="tensor_layout"):
        attention.sageattn(q, k, v, tensor_layout="BSHD")
