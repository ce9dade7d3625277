"""Reversibility, resolve-once caching, decorators (ours and `kernels`'), import cost."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import kernels
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kerneld_client.layers import (
    Cause,
    LayerRepository,
    LayerStatus,
    LocalLayerRepository,
    Mode,
    _repos,
    kernelize,
    kernelize_report,
    replace_kernel_forward_from_hub,
    unkernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
    use_kernelized_func,
)
from tests.layers import synth
from tests.layers.model import RMSNorm, SiluAndMul, make_model, marked_names, tokens

ROOT = Path(__file__).resolve().parents[2]


def both(path: Path) -> dict:
    return {
        name: {"cpu": LocalLayerRepository(path, layer_name=name)}
        for name in ("RMSNorm", "SiluAndMul")
    }


def instance_forwards(model: nn.Module) -> list[object]:
    return [
        m.__dict__.get("forward") for m in model.modules() if isinstance(m, RMSNorm | SiluAndMul)
    ]


@pytest.fixture
def counted_loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every real attempt to obtain a kernel: (repo, "ok" | exception name)."""
    calls: list[tuple[str, str]] = []
    real = _repos._load_repository

    def counting(repo: _repos._Repository, backend: str | None) -> _repos.KernelSource:
        try:
            source = real(repo, backend)
        except Exception as exc:
            calls.append((str(repo), type(exc).__name__))
            raise
        calls.append((str(repo), "ok"))
        return source

    monkeypatch.setattr(_repos, "_load_repository", counting)
    return calls


def test_unkernelize_restores_every_instance(act_arch: Path) -> None:
    model = make_model().eval()
    with torch.no_grad():
        expected = model(tokens())
    with use_kernel_mapping(both(act_arch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert all(f is not None for f in instance_forwards(model))
    assert unkernelize(model) is model
    assert instance_forwards(model) == [None] * len(marked_names(model))
    assert kernelize_report(model) is None
    with torch.no_grad():
        assert torch.equal(model(tokens()), expected)


def test_a_later_fallback_returns_to_pytorch_not_to_the_previous_kernel(act_arch: Path) -> None:
    model = make_model()
    with use_kernel_mapping(both(act_arch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
        kernelize(model, mode=Mode.TRAINING, device="cpu")  # compiled layers: no backward
    report = kernelize_report(model)
    assert report is not None and {e.cause for e in report} == {Cause.MODE_UNSUPPORTED}
    assert instance_forwards(model) == [None] * len(marked_names(model))


def test_an_instance_level_forward_is_kept_and_restored(act_arch: Path) -> None:
    model = make_model()
    norm = model.blocks[0].attn_norm

    def custom(hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * 2

    norm.forward = custom
    with use_kernel_mapping(both(act_arch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
        assert norm.forward is not custom
        kernelize(model, mode=Mode.TRAINING, device="cpu")  # fallback: back to the user's forward
        assert norm.forward is custom
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    unkernelize(model)
    assert norm.forward is custom


def test_many_instances_resolve_once(act_noarch: Path, counted_loads: list) -> None:
    model = make_model(blocks=8)
    assert len(marked_names(model)) == 8 * 3 + 1
    with use_kernel_mapping(both(act_noarch)):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
        assert counted_loads == [(f"`{act_noarch}` (layer `RMSNorm`)", "ok")]
        kernelize(make_model(blocks=8), mode=Mode.INFERENCE, device="cpu")
        assert len(counted_loads) == 1  # cached for the process
        _repos.clear_kernel_cache()
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
        assert len(counted_loads) == 2
    report = kernelize_report(model)
    assert report is not None and len(report.kernelized) == 25


def test_failures_are_attempted_once_per_kernelize(counted_loads: list) -> None:
    model = make_model(blocks=8)
    repo = "kerneld-examples/activation"
    mapping = {
        name: {"cpu": LayerRepository(repo, layer_name=name, version=1)}
        for name in ("RMSNorm", "SiluAndMul")
    }
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
        assert [outcome for _, outcome in counted_loads] == ["DaemonUnavailable"]
        kernelize(model, mode=Mode.INFERENCE, device="cpu")  # not cached across calls
        assert len(counted_loads) == 2


@use_kernel_forward_from_hub("SiluAndMul")
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@use_kernelized_func(silu_and_mul)
class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(self.up(x))


def test_decorated_functions_are_kernelized(act_arch: Path) -> None:
    model = nn.Sequential(GatedMLP())
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = model(x)
    assert "silu_and_mul" not in dict(model.named_modules())  # not a submodule
    with use_kernel_mapping(both(act_arch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    # Keyed as `kernels` keys attached functions: by layer name (a module has no __name__).
    assert [(e.name, e.status) for e in report] == [("0.SiluAndMul", LayerStatus.KERNELIZED)]
    own = model[0].__dict__["_kernel_funcs"]["SiluAndMul"]  # the instance's own wrapper
    assert own.__dict__["forward"].__func__.__module__.endswith(".layers")
    assert "forward" not in silu_and_mul.__dict__  # the shared function is never swapped
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
    unkernelize(model)
    assert "forward" not in own.__dict__


def test_use_kernelized_func_refuses_undecorated_functions() -> None:
    with pytest.raises(ValueError, match="not decorated"):
        use_kernelized_func(F.silu)


def test_condition_skips_instances(act_arch: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Norm(nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))
            self.variance_epsilon = 1e-6

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return hidden_states

    replace_kernel_forward_from_hub(Norm, "RMSNorm", condition=lambda m: m.weight.numel() >= 32)
    model = nn.Sequential(Norm(16), Norm(64))
    with use_kernel_mapping(both(act_arch)), caplog.at_level("INFO", "kerneld_client.layers"):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    assert [(e.name, e.status) for e in report] == [
        ("0", LayerStatus.SKIPPED),
        ("1", LayerStatus.KERNELIZED),
    ]
    # The record `kernels` writes for a skipped instance, word for word.
    skipped = "Skipping kernelization for `Norm` using `RMSNorm` due to kernel_condition."
    assert caplog.text.count(skipped) == 1


def test_kernels_decorators_are_honoured(act_arch: Path) -> None:
    """A model marked with `kernels`' own decorators is kernelized by ours (same attributes)."""

    @kernels.use_kernel_forward_from_hub("RMSNorm")
    class KNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.rand(32) + 0.5)
            self.variance_epsilon = 1e-6

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            xf = hidden_states.float()
            normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (normed * self.weight.float()).to(hidden_states.dtype)

    @kernels.use_kernel_forward_from_hub("SiluAndMul")
    def k_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    @kernels.use_kernelized_func(k_silu_and_mul)
    class KBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = KNorm()
            self.up = nn.Linear(32, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return k_silu_and_mul(self.up(self.norm(x)))

    model = KBlock()
    x = torch.randn(3, 32)
    with torch.no_grad():
        expected = model(x)
    with use_kernel_mapping(both(act_arch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    assert sorted((e.name, e.status.value) for e in report) == [
        ("SiluAndMul", "kernelized"),
        ("norm", "kernelized"),
    ]
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    unkernelize(model)


def test_kernels_kernelize_honours_our_decorator(tmp_path: Path) -> None:
    """And the other way round: `kernels.kernelize` sees layers marked by kerneld_client."""
    path = synth.write_kernel(tmp_path / "k")
    model = make_model()
    mapping = {"RMSNorm": {"cpu": kernels.LocalLayerRepository(path, layer_name="RMSNorm")}}
    with kernels.use_kernel_mapping(mapping):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
    norm = model.blocks[0].attn_norm
    assert norm.forward.__func__ is not RMSNorm.forward
    assert norm.forward.__func__.__module__.endswith(".layers")


def test_importing_and_decorating_a_class_needs_no_torch() -> None:
    code = (
        "import sys\n"
        "import kerneld_client.layers as L\n"
        "@L.use_kernel_forward_from_hub('RMSNorm')\n"
        "class A:\n"
        "    def forward(self, x):\n"
        "        return x\n"
        "L.register_kernel_mapping({'RMSNorm': {'cuda': L.LayerRepository("
        "'org/k', layer_name='RMSNorm', version=1)}})\n"
        "print(json.dumps([m for m in ('torch', 'grpc', 'huggingface_hub', 'kerneld') "
        "if m in sys.modules] + [A.kernel_layer_name]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{ROOT / 'client'}"},
    )
    assert json.loads(out.stdout) == ["RMSNorm"]


def test_a_deep_copy_keeps_working_and_can_be_unkernelized(act_arch: Path) -> None:
    model = make_model().eval()
    with use_kernel_mapping(both(act_arch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    clone = copy.deepcopy(model)
    norm = clone.blocks[0].attn_norm
    assert norm.forward.__self__ is norm  # rebound to the copy: it reads the copy's weight
    with torch.no_grad():
        norm.weight.mul_(2)
        assert not torch.equal(clone(tokens()), model(tokens()))
    unkernelize(clone)
    assert instance_forwards(clone) == [None] * len(marked_names(clone))
    assert all(f is not None for f in instance_forwards(model))


def test_kernels_repositories_work_in_our_mappings(tmp_path: Path) -> None:
    """A `kernels` repository object in a kerneld mapping is loaded through its own load()."""
    path = synth.write_kernel(tmp_path / "k")
    repo = kernels.LocalLayerRepository(path, layer_name="RMSNorm")
    model = make_model()
    with use_kernel_mapping({"RMSNorm": {"cpu": repo}}):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    norms = [e for e in report if e.layer_name == "RMSNorm"]
    assert {(e.status, e.repo) for e in norms} == {(LayerStatus.KERNELIZED, str(repo))}
