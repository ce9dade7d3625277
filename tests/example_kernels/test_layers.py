"""The example kernels' hub layers: forward and backward against PyTorch, and `kernels`'
kernelize swapping a model's modules for them."""

from __future__ import annotations

import sys
from types import MethodType

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from examples.kernels.built import BuiltExamples
from tests.example_kernels.support import (
    DTYPES,
    EPS,
    KINDS,
    import_variant,
    pick,
    ref_gelu_and_mul,
    ref_gelu_tanh_and_mul,
    ref_rms_norm,
    ref_silu_and_mul,
    tol,
)


def _rms_host(hidden: int, dtype: torch.dtype) -> nn.Module:
    """Stands in for a model's RMSNorm module, whose attributes a hub layer reads."""
    host = nn.Module()
    host.weight = nn.Parameter(
        torch.randn(hidden, generator=torch.Generator().manual_seed(3)).to(dtype)
    )
    host.variance_epsilon = EPS
    return host


@pytest.mark.parametrize("kind", KINDS)
def test_layers_forward(built_examples: BuiltExamples, kind: str):
    mod = import_variant(pick(built_examples, kind, 2))
    layers = mod.layers
    for dtype in DTYPES:
        x = torch.randn(3, 5, 16).to(dtype)
        for cls, ref in (
            (layers.SiluAndMul, ref_silu_and_mul),
            (layers.GeluTanhAndMul, ref_gelu_tanh_and_mul),
            (layers.GeluAndMul, ref_gelu_and_mul),
        ):
            torch.testing.assert_close(cls().forward(x), ref(x), **tol(dtype))
        host = _rms_host(16, dtype)
        got = MethodType(layers.RMSNorm.forward, host)(x)
        torch.testing.assert_close(got, ref_rms_norm(x, host.weight, EPS), **tol(dtype))
    compiled = kind == "arch"
    for cls in (layers.SiluAndMul, layers.RMSNorm):
        assert cls.has_backward is not compiled
        assert cls.can_torch_compile is not compiled


@pytest.mark.parametrize("kind", ["torch-cpu", "torch-universal"])
def test_noarch_layers_backward(built_examples: BuiltExamples, kind: str):
    layers = import_variant(pick(built_examples, kind, 1)).layers
    x = torch.randn(4, 12, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    layers.SiluAndMul().forward(x).pow(2).sum().backward()
    ref_silu_and_mul(x_ref).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)

    host = _rms_host(12, torch.float32)
    ref_weight = host.weight.detach().clone().requires_grad_(True)
    x32 = torch.randn(4, 12, requires_grad=True)
    x32_ref = x32.detach().clone().requires_grad_(True)
    MethodType(layers.RMSNorm.forward, host)(x32).sum().backward()
    F.rms_norm(x32_ref, (12,), ref_weight, EPS).sum().backward()
    torch.testing.assert_close(x32.grad, x32_ref.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(host.weight.grad, ref_weight.grad, rtol=1e-4, atol=1e-5)


def test_kernelize_uses_the_compiled_layer(built_examples: BuiltExamples):
    from kernels import (
        LocalLayerRepository,
        Mode,
        kernelize,
        use_kernel_forward_from_hub,
        use_kernel_mapping,
    )

    @use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ref_silu_and_mul(x)

    @use_kernel_forward_from_hub("RMSNorm")
    class LlamaRMSNorm(nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.rand(hidden) + 0.5)
            self.variance_epsilon = EPS

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return ref_rms_norm(hidden_states, self.weight, self.variance_epsilon)

    kernel = built_examples.kernel("activation", 2)
    arch = built_examples.variant("activation", 2)
    mapping = {
        name: {"cpu": LocalLayerRepository(repo_path=kernel.path, layer_name=name)}
        for name in ("SiluAndMul", "RMSNorm")
    }
    x = torch.randn(2, 3, 16)
    with use_kernel_mapping(mapping, inherit_mapping=False):
        model = kernelize(
            nn.Sequential(LlamaRMSNorm(16), SiluAndMul()), mode=Mode.INFERENCE, device="cpu"
        )
        layers = sys.modules[arch.module_id].layers  # `kernels` imported it under its id
        assert model[0].forward.__func__ is layers.RMSNorm.forward
        assert model[1].forward.__func__ is layers.SiluAndMul.forward
        with torch.no_grad():
            expected = ref_silu_and_mul(ref_rms_norm(x, model[0].weight, EPS))
            torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        # The compiled layers declare has_backward = False: training keeps the original forward.
        trained = kernelize(nn.Sequential(SiluAndMul()), mode=Mode.TRAINING, device="cpu")
        assert trained[0].forward.__func__ is SiluAndMul.forward
