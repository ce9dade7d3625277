"""Kernelized vs PyTorch on a small transformer with the real example kernels."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from kerneld_client.layers import (
    Cause,
    LayerStatus,
    LocalLayerRepository,
    Mode,
    kernelize,
    kernelize_report,
    use_kernel_mapping,
)
from tests.layers.model import RMSNorm, SiluAndMul, make_model, marked_names, tokens


def mapping(path: Path) -> dict[str, dict[str, LocalLayerRepository]]:
    return {
        "RMSNorm": {"cpu": LocalLayerRepository(path, layer_name="RMSNorm")},
        "SiluAndMul": {"cpu": LocalLayerRepository(path, layer_name="SiluAndMul")},
    }


def test_inference_runs_the_compiled_kernel_and_matches(act_arch: Path) -> None:
    model = make_model().eval()
    class_forwards = (RMSNorm.__dict__["forward"], SiluAndMul.__dict__["forward"])
    x = tokens()
    with torch.no_grad():
        expected = model(x)
    with use_kernel_mapping(mapping(act_arch)):
        assert kernelize(model, mode=Mode.INFERENCE, device="cpu") is model

    report = kernelize_report(model)
    assert report is not None
    assert [e.name for e in report] == marked_names(model)
    assert all(e.status is LayerStatus.KERNELIZED for e in report), report.format()
    assert {e.variant for e in report} == {act_arch.name}
    # Replaced per instance, never on the class.
    assert (RMSNorm.__dict__["forward"], SiluAndMul.__dict__["forward"]) == class_forwards
    namespaces = set()
    for module in model.modules():
        if isinstance(module, RMSNorm | SiluAndMul):
            bound = module.__dict__["forward"]
            assert bound.__self__ is module
            assert bound.__func__.__qualname__ == f"{type(module).__name__}.forward"
            assert bound.__func__ is not type(module).forward
            namespaces.add(bound.__func__.__module__.removesuffix(".layers"))
    (namespace,) = namespaces  # the build's metadata id, also its op namespace

    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=cpu) as prof:
        got = model(x)
    ops = {evt.key for evt in prof.key_averages()}
    assert f"{namespace}::rms_norm" in ops, sorted(ops)
    assert f"{namespace}::silu_and_mul" in ops, sorted(ops)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_training_with_the_noarch_kernel_matches_forward_and_backward(act_noarch: Path) -> None:
    reference = make_model().train()
    model = copy.deepcopy(reference)
    with use_kernel_mapping(mapping(act_noarch)):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
    report = kernelize_report(model)
    assert report is not None and len(report.kernelized) == len(marked_names(model))

    x = tokens()
    for m in (reference, model):
        loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
        loss.backward()
    torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
    for (name, p_ref), (_, p) in zip(
        reference.named_parameters(), model.named_parameters(), strict=True
    ):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=name)
    # The grads flowed through the kernel layers' forward, not the originals.
    norm = model.blocks[0].attn_norm
    assert norm.forward.__func__ is not RMSNorm.forward


def test_training_refuses_a_layer_without_backward(act_arch: Path) -> None:
    model = make_model().train()
    with use_kernel_mapping(mapping(act_arch)):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    assert {e.status for e in report} == {LayerStatus.FALLBACK}
    assert {e.cause for e in report} == {Cause.MODE_UNSUPPORTED}
    assert "has_backward=False" in report.layers[0].reason
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm | SiluAndMul):
            assert "forward" not in module.__dict__, name
    loss = model(tokens()).sum()
    loss.backward()  # the PyTorch forwards have a backward
    assert model.blocks[0].attn_norm.weight.grad is not None


def test_training_refusal_raises_without_fallback(act_arch: Path) -> None:
    model = make_model().train()
    with use_kernel_mapping(mapping(act_arch)), pytest.raises(ValueError, match="has_backward"):
        kernelize(model, mode=Mode.TRAINING, device="cpu", use_fallback=False)


def test_inference_from_a_local_repo_picks_the_best_variant(act_repo: Path, act_arch: Path) -> None:
    model = make_model().eval()
    with use_kernel_mapping(mapping(act_repo)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    assert {e.variant for e in report} == {act_arch.name}  # compiled > torch-cpu > universal
