"""The example kernels' ops, compiled and pure-PyTorch, against PyTorch's own functions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from examples.kernels.built import BuiltExamples
from tests.example_kernels.support import (
    DTYPES,
    EPS,
    GATED_REFS,
    GATED_SHAPES,
    KINDS,
    NORM_SHAPES,
    import_variant,
    pick,
    ref_relu2,
    ref_relu2_and_mul,
    ref_rms_norm,
    ref_silu_and_mul,
    tol,
)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_gated_activations_match_pytorch(built_examples: BuiltExamples, kind: str, version: int):
    mod = import_variant(pick(built_examples, kind, version))
    names = ["silu_and_mul", "gelu_tanh_and_mul"] + (["gelu_and_mul"] if version >= 2 else [])
    gen = torch.Generator().manual_seed(0)
    for name in names:
        out_variant = getattr(mod, name)
        alloc = getattr(mod, f"{name}_alloc")
        for shape in GATED_SHAPES:
            for dtype in DTYPES:
                x = (torch.randn(shape, generator=gen) * 3).to(dtype)
                expected = GATED_REFS[name](x)
                out = torch.empty(expected.shape, dtype=dtype)
                assert out_variant(out, x) is out
                torch.testing.assert_close(out, expected, **tol(dtype), msg=f"{name} {shape}")
                torch.testing.assert_close(alloc(x), expected, **tol(dtype))
                op_out = torch.empty_like(out)
                getattr(mod.ops, name)(op_out, x)
                torch.testing.assert_close(op_out, expected, **tol(dtype))


ELEMENTWISE_REFS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_elementwise_activations_match_pytorch(built_examples: BuiltExamples, kind: str):
    """Transformers' `SiLU` and `GeluTanh` kinds: same shape in and out, any layout."""
    mod = import_variant(pick(built_examples, kind, 1))
    gen = torch.Generator().manual_seed(4)
    for name, ref in ELEMENTWISE_REFS.items():
        layer = {"silu": mod.layers.Silu, "gelu_tanh": mod.layers.GeluTanh}[name]()
        for shape in GATED_SHAPES:
            for dtype in DTYPES:
                x = (torch.randn(shape, generator=gen) * 3).to(dtype)
                out = torch.empty_like(x)
                assert getattr(mod, name)(out, x) is out
                torch.testing.assert_close(out, ref(x), **tol(dtype), msg=f"{name} {shape}")
                torch.testing.assert_close(layer.forward(x), ref(x), **tol(dtype))
        strided = torch.randn(6, 10, generator=gen).t()
        torch.testing.assert_close(layer.forward(strided), ref(strided))


def ref_apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformers' `apply_rotary_pos_emb`, written out."""

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    cos, sin = cos.unsqueeze(dim), sin.unsqueeze(dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.parametrize("version", [1, 2])
def test_rotary_function_kernel_matches_pytorch(built_examples: BuiltExamples, version: int):
    mod = import_variant(built_examples.variant("rotary", version))
    gen = torch.Generator().manual_seed(5)
    layer = mod.layers.apply_rotary_transformers()
    for dtype in DTYPES:
        # (batch, heads, seq, head_dim) with grouped KV heads; cos/sin are (batch, seq, head_dim).
        q = torch.randn(2, 4, 5, 8, generator=gen).to(dtype)
        k = torch.randn(2, 2, 5, 8, generator=gen).to(dtype)
        cos, sin = torch.randn(2, 2, 5, 8, generator=gen).to(dtype).unbind(0)
        expected = ref_apply_rotary(q, k, cos, sin)
        for got in (mod.apply_rotary_transformers(q, k, cos, sin), layer.forward(q, k, cos, sin)):
            torch.testing.assert_close(got, expected, **tol(dtype))
    # unsqueeze_dim=2: the (batch, seq, heads, head_dim) layout.
    q, k = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8)
    cos, sin = torch.randn(2, 2, 5, 8).unbind(0)
    torch.testing.assert_close(
        mod.apply_rotary_transformers(q, k, cos, sin, 2), ref_apply_rotary(q, k, cos, sin, 2)
    )
    with pytest.raises(RuntimeError, match="must be even"):
        mod.apply_rotary_transformers(
            torch.randn(1, 1, 2, 5),
            torch.randn(1, 1, 2, 5),
            torch.randn(1, 2, 5),
            torch.randn(1, 2, 5),
        )


@pytest.mark.parametrize("kind", KINDS)
def test_rms_norm_matches_pytorch(built_examples: BuiltExamples, kind: str):
    mod = import_variant(pick(built_examples, kind, 1))
    gen = torch.Generator().manual_seed(1)
    for shape in NORM_SHAPES:
        for dtype in DTYPES:
            x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(dtype)
            weight = torch.randn(shape[-1], generator=gen).to(dtype)
            expected = ref_rms_norm(x, weight, EPS)
            out = torch.empty_like(x)
            assert mod.rms_norm(out, x, weight, EPS) is out
            torch.testing.assert_close(out, expected, **tol(dtype), msg=f"{shape} {dtype}")
            torch.testing.assert_close(mod.rms_norm_alloc(x, weight, EPS), expected, **tol(dtype))
            if dtype == torch.float32:
                plain = F.rms_norm(x, (shape[-1],), weight, EPS)
                torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)


def test_compiled_ops_take_non_contiguous_input_and_check_shapes(built_examples: BuiltExamples):
    mod = import_variant(pick(built_examples, "arch", 1))
    x = torch.randn(6, 10).t()  # (10, 6), not contiguous
    assert not x.is_contiguous()
    torch.testing.assert_close(mod.silu_and_mul_alloc(x), ref_silu_and_mul(x))
    with pytest.raises(RuntimeError, match="must be even"):
        mod.silu_and_mul_alloc(torch.randn(2, 5))
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        mod.silu_and_mul_alloc(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="weight has shape"):
        mod.rms_norm_alloc(torch.randn(2, 4), torch.ones(3), EPS)


@pytest.mark.parametrize("version", [1, 2])
def test_relu2_matches_pytorch(built_examples: BuiltExamples, version: int):
    mod = import_variant(built_examples.variant("relu2", version))
    gen = torch.Generator().manual_seed(2)
    for shape in GATED_SHAPES:
        for dtype in DTYPES:
            x = torch.randn(shape, generator=gen).to(dtype)
            out = torch.empty_like(x)
            assert mod.relu2(out, x) is out
            torch.testing.assert_close(out, ref_relu2(x), **tol(dtype))
            torch.testing.assert_close(mod.layers.ReLU2().forward(x), ref_relu2(x), **tol(dtype))
            if version >= 2:
                torch.testing.assert_close(
                    mod.relu2_and_mul_alloc(x), ref_relu2_and_mul(x), **tol(dtype)
                )
    assert hasattr(mod, "relu2_and_mul") == (version >= 2)
