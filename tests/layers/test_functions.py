"""Function kernels with kerneld's layer API: a function marked with
`use_kernel_forward_from_hub` and attached with `use_kernelized_func` (how Transformers marks
`apply_rotary_pos_emb`), replaced by the example `rotary` kernel -- through its layer
(`LocalLayerRepository`) and through `kernels`' deprecated function repositories, which take the
kernel's top-level function instead."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from pathlib import Path
from types import MethodType

import pytest
import torch
from torch import nn

from examples.kernels.built import BuiltExamples
from kerneld_client.layers import (
    FuncRepository,
    LayerStatus,
    LocalFuncRepository,
    LocalLayerRepository,
    LockedFuncRepository,
    LockedLayerRepository,
    Mode,
    kernelize,
    kernelize_report,
    unkernelize,
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernel_mapping,
    use_kernelized_func,
)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


@use_kernel_forward_from_hub("rotary_pos_emb")
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@use_kernelized_func(apply_rotary_pos_emb)
class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.fixture
def model() -> Iterator[nn.Module]:
    m = nn.Sequential(Attention(), Attention()).eval()
    yield m
    unkernelize(m)
    assert apply_rotary_pos_emb.forward.__func__.__qualname__.endswith("forward")


@pytest.fixture(scope="module")
def rotary(built_examples: BuiltExamples) -> Path:
    return built_examples.variant("rotary", 1).path


def inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 8, generator=gen), torch.randn(2, 2, 6, 8, generator=gen)
    cos, sin = torch.randn(2, 2, 6, 8, generator=gen).unbind(0)
    return q, k, cos, sin


def run(model: nn.Module, repo: object) -> tuple[torch.Tensor, torch.Tensor]:
    with use_kernel_mapping({"rotary_pos_emb": {"cpu": repo}}):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    return model[0](*inputs())


def wrapper(layer: nn.Module) -> nn.Module:
    """The layer instance's own wrapper of `apply_rotary_pos_emb` (what kernelize swaps)."""
    wrappers = layer.__dict__["_kernel_funcs"]
    assert list(wrappers) == ["rotary_pos_emb"]
    found: nn.Module = wrappers["rotary_pos_emb"]
    return found


def test_a_function_kernel_replaces_the_marked_function(model: nn.Module, rotary: Path) -> None:
    expected = model[0](*inputs())
    got = run(model, LocalLayerRepository(rotary, layer_name="apply_rotary_transformers"))
    for layer in model:
        fn = wrapper(layer).forward.__func__
        assert fn.__qualname__ == "apply_rotary_transformers.forward"
        assert Path(fn.__code__.co_filename).is_relative_to(rotary)
    # the shared function itself is never swapped: a model that was not kernelized keeps it
    assert "forward" not in apply_rotary_pos_emb.__dict__
    torch.testing.assert_close(got, expected)
    report = kernelize_report(model)
    assert report is not None
    # Each attention layer has its own wrapper of the function: kernelized one by one.
    assert [(r.name, r.status) for r in report] == [
        ("0.rotary_pos_emb", LayerStatus.KERNELIZED),
        ("1.rotary_pos_emb", LayerStatus.KERNELIZED),
    ]


def test_function_kernels_are_per_model_and_survive_copies(model: nn.Module, rotary: Path) -> None:
    """Two models calling one marked function: kernelizing one leaves the other on PyTorch; a
    copy or a pickled model keeps the kernel and unkernelizes without touching the original
    (kernels 0.19's per-instance kernel functions)."""
    other = nn.Sequential(Attention())
    run(model, LocalLayerRepository(rotary, layer_name="apply_rotary_transformers"))
    kernel = wrapper(model[0]).forward.__func__
    assert "forward" not in wrapper(other[0]).__dict__
    torch.testing.assert_close(other[0](*inputs()), model[0](*inputs()))
    for restore in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        restored = restore(model)
        for layer in restored:
            assert wrapper(layer).forward.__func__ is kernel
            assert wrapper(layer).forward.__self__ is wrapper(layer)
        assert wrapper(restored[0]) is not wrapper(model[0])
        torch.testing.assert_close(restored[0](*inputs()), model[0](*inputs()))
        unkernelize(restored)
        assert "forward" not in wrapper(restored[0]).__dict__
        assert wrapper(model[0]).forward.__func__ is kernel
    shallow = copy.copy(wrapper(model[0]))
    assert shallow.forward.__self__ is shallow and shallow.forward.__func__ is kernel


def test_a_bound_function_kernel_falls_back_to_the_function(model: nn.Module) -> None:
    """A fallback leaves no forward on a function's wrapper, whoever bound it (as kernels)."""
    bound = wrapper(model[0])
    bound.forward = MethodType(lambda self, q, k, cos, sin: (q, k), bound)
    with use_kernel_mapping({"rotary_pos_emb": {}}, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert "forward" not in bound.__dict__
    q, k, cos, sin = inputs()
    torch.testing.assert_close(model[0](q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin))


def test_func_repository_takes_the_kernels_top_level_function(
    model: nn.Module, rotary: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = model[0](*inputs())
    repo = LocalFuncRepository(rotary, func_name="apply_rotary_transformers")
    assert "LocalFuncRepository is deprecated, as in kernels 0.17" in caplog.text
    got = run(model, repo)
    fn = wrapper(model[0]).forward.__func__
    assert fn.__qualname__.startswith("function_layer_class")  # a module around the function
    torch.testing.assert_close(got, expected)
    report = kernelize_report(model)
    assert report is not None and [r.status for r in report] == [LayerStatus.KERNELIZED] * 2
    assert report.layers[0].hub_layer == "apply_rotary_transformers"


def test_a_missing_function_keeps_pytorch_and_says_so(model: nn.Module, rotary: Path) -> None:
    repo = LocalFuncRepository(rotary, func_name="no_such_function")
    expected = model[0](*inputs())
    torch.testing.assert_close(run(model, repo), expected)
    report = kernelize_report(model)
    assert report is not None
    for entry in report.layers:
        assert entry.status is not LayerStatus.KERNELIZED
        assert "function `no_such_function` not found" in entry.reason


def test_function_repositories_are_their_own_kind() -> None:
    func = FuncRepository("org/rotary", func_name="f", version=1)
    same = FuncRepository("org/rotary", func_name="f", version=1)
    locked = LockedFuncRepository("org/rotary", lockfile=Path("k.lock"), func_name="f")
    with pytest.raises(ValueError, match="not both"):
        FuncRepository("org/rotary", func_name="f", version=1, revision="main")
    layer = LocalLayerRepository(Path("x"), layer_name="f")
    assert func == same and hash(func) == hash(same)
    from kerneld_client.layers import LayerRepository

    assert func != LayerRepository("org/rotary", layer_name="f", version=1)
    assert locked != LockedLayerRepository("org/rotary", lockfile=Path("k.lock"), layer_name="f")
    local_func = LocalFuncRepository(Path("x"), func_name="f")
    assert layer != local_func and local_func != layer
    assert str(func) == "`org/rotary` (v1), function `f`"
    assert "func_name='f'" in repr(locked)


def test_use_kernel_func_from_hub_is_the_deprecated_spelling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deco = use_kernel_func_from_hub("relu")
    assert "use use_kernel_forward_from_hub instead" in caplog.text

    @deco
    def relu(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

    assert type(relu).kernel_layer_name == "relu"  # type: ignore[attr-defined]
    x = torch.randn(4)
    torch.testing.assert_close(relu(x), torch.relu(x))
