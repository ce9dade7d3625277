"""The example kernels: ops against PyTorch, Hub layout and metadata, caching, git repos.

These kernels are the test material for the rest of kerneld, so this file checks that they are
what the other tests assume: loadable by `kernels`, distinct per build, v1 != v2, digests right.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import MethodType, ModuleType

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from examples.kernels import build as kbuild
from examples.kernels.build import BuiltExamples, BuiltVariant, HubRoot

KINDS = ("arch", "torch-cpu", "torch-universal")
DTYPES = (torch.float32, torch.bfloat16)
GATED_SHAPES = ((1, 2), (3, 16), (2, 3, 34), (0, 8), (5, 4, 2, 6))
NORM_SHAPES = ((1, 1), (3, 16), (2, 3, 33), (0, 8))
EPS = 1e-6


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # bf16: the kernels round once from float, PyTorch's reference rounds after each op.
    return {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}


def ref_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def ref_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def ref_gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def ref_relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def ref_relu2_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.relu(x[..., :d]).square() * x[..., d:]


GATED_REFS = {
    "silu_and_mul": ref_silu_and_mul,
    "gelu_tanh_and_mul": ref_gelu_tanh_and_mul,
    "gelu_and_mul": ref_gelu_and_mul,
    "relu2_and_mul": ref_relu2_and_mul,
}


def import_variant(variant: BuiltVariant) -> ModuleType:
    """Import a variant the way `kernels` does: under its metadata id, with relative imports."""
    if variant.module_id in sys.modules:
        return sys.modules[variant.module_id]
    spec = importlib.util.spec_from_file_location(
        variant.module_id, variant.init_file, submodule_search_locations=[str(variant.path)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[variant.module_id] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(variant.module_id, None)
        raise
    return module


def pick(built: BuiltExamples, kind: str, version: int, kernel: str = "activation") -> BuiltVariant:
    return built.variant(kernel, version, None if kind == "arch" else kind)


def git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"})
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True)
    return out.stdout.decode(errors="replace").strip()


# --------------------------------------------------------------------------- ops


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
                torch.testing.assert_close(out, expected, **_tol(dtype), msg=f"{name} {shape}")
                torch.testing.assert_close(alloc(x), expected, **_tol(dtype))
                op_out = torch.empty_like(out)
                getattr(mod.ops, name)(op_out, x)
                torch.testing.assert_close(op_out, expected, **_tol(dtype))


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
                torch.testing.assert_close(out, ref(x), **_tol(dtype), msg=f"{name} {shape}")
                torch.testing.assert_close(layer.forward(x), ref(x), **_tol(dtype))
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
            torch.testing.assert_close(got, expected, **_tol(dtype))
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
            torch.testing.assert_close(out, expected, **_tol(dtype), msg=f"{shape} {dtype}")
            torch.testing.assert_close(mod.rms_norm_alloc(x, weight, EPS), expected, **_tol(dtype))
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
            torch.testing.assert_close(out, ref_relu2(x), **_tol(dtype))
            torch.testing.assert_close(mod.layers.ReLU2().forward(x), ref_relu2(x), **_tol(dtype))
            if version >= 2:
                torch.testing.assert_close(
                    mod.relu2_and_mul_alloc(x), ref_relu2_and_mul(x), **_tol(dtype)
                )
    assert hasattr(mod, "relu2_and_mul") == (version >= 2)


# --------------------------------------------------------------------------- layers


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
            torch.testing.assert_close(cls().forward(x), ref(x), **_tol(dtype))
        host = _rms_host(16, dtype)
        got = MethodType(layers.RMSNorm.forward, host)(x)
        torch.testing.assert_close(got, ref_rms_norm(x, host.weight, EPS), **_tol(dtype))
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


# --------------------------------------------------------------------------- layout & metadata


def test_variant_name_matches_local_platform(built_examples: BuiltExamples):
    from kernels.variants import get_variants_local, resolve_variant

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    assert platform.system() == "Linux"  # the project's platform; the name below is Linux's
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    expected = f"torch{major}{minor}-{abi}-cpu-{platform.machine()}-linux"
    assert built_examples.arch_variant == expected == kbuild.local_arch_variant()
    for kernel in built_examples.kernels:
        names = sorted(p.name for p in (kernel.path / "build").iterdir())
        assert names == sorted(v.variant for v in kernel.variants)
        chosen, _ = resolve_variant(get_variants_local(kernel.path / "build"))
        assert chosen is not None and chosen.variant_str == expected


def test_metadata_is_complete_and_digests_match(built_examples: BuiltExamples):
    from kernels import Metadata
    from kernels._rust import Digest, DigestAlgorithm

    ids = set()
    for v in built_examples.all_variants():
        raw = json.loads(v.metadata_file.read_text())
        required = {"id", "name", "version", "license", "python-depends", "backend", "digest"}
        assert set(raw) >= required
        meta = Metadata.read_from_file(v.metadata_file)
        assert meta.id == v.module_id and meta.id.startswith(f"_{v.kernel}_")
        assert str(meta.name) == v.kernel and meta.version == v.version
        assert meta.license == "Apache-2.0" and meta.python_depends == []
        assert raw["backend"] == {"type": "cpu"} and raw["digest"]["algorithm"] == "sha256"
        files = {p for p in v.files if p != "metadata.json"}
        assert set(raw["digest"]["files"]) == files
        assert (v.library in files) == v.compiled
        if v.compiled:
            assert v.library == f"{v.module_id}.abi3.so"
        actual = Digest.hash_variant(DigestAlgorithm.SHA256, v.path)
        assert meta.digest is not None
        meta.digest.validate(actual)  # raises on any difference
        assert actual.files == kbuild.variant_digest(v.path)
        assert kbuild.verify_variant(v.path) == []
        ids.add(v.module_id)
    assert len(ids) == len(list(built_examples.all_variants())), "ids must be unique per build"


def test_digest_catches_a_changed_file(built_examples: BuiltExamples, tmp_path: Path):
    from kernels import Metadata
    from kernels._rust import Digest, DigestAlgorithm, DigestValidationError

    v = built_examples.variant("activation", 1)
    copy = tmp_path / v.variant
    shutil.copytree(v.path, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / v.library).open("ab") as f:  # type: ignore[operator]
        f.write(b"\0")
    (copy / "extra.py").write_text("")
    assert kbuild.verify_variant(copy) == ["unexpected extra.py", f"hash mismatch {v.library}"]
    meta = Metadata.read_from_file(copy / "metadata.json")
    assert meta.digest is not None
    with pytest.raises(DigestValidationError):
        meta.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, copy))


def test_v1_and_v2_differ_observably(built_examples: BuiltExamples):
    for kind in KINDS:
        v1 = import_variant(pick(built_examples, kind, 1))
        v2 = import_variant(pick(built_examples, kind, 2))
        assert (v1.__version__, v2.__version__) == ("1.0.0", "2.0.0")
        assert not hasattr(v1, "gelu_and_mul") and hasattr(v2, "gelu_and_mul")
        assert not hasattr(v1.ops, "gelu_and_mul") and hasattr(v2.ops, "gelu_and_mul")
        assert v1.__name__ != v2.__name__
    assert built_examples.variant("relu2", 1).ops == ("relu2",)
    assert built_examples.variant("relu2", 2).ops == ("relu2", "relu2_and_mul")


def test_kernels_import_side_by_side(built_examples: BuiltExamples):
    variants = [
        built_examples.variant("activation", 1),
        built_examples.variant("activation", 2),
        built_examples.variant("relu2", 1),
        built_examples.variant("relu2", 2),
        built_examples.variant("activation", 2, "torch-cpu"),
    ]
    modules = [import_variant(v) for v in variants]
    assert len({m.__name__ for m in modules}) == len(variants)
    for v, m in zip(variants, modules, strict=True):
        assert sys.modules[v.module_id] is m and m.__name__ == v.module_id
        assert m.add_op_namespace_prefix("x") == f"{v.module_id}::x"
        for op in v.ops:
            assert hasattr(getattr(torch.ops, v.module_id), op)
        if v.compiled:
            assert sys.modules[f"{v.module_id}.{v.module_id}"].__file__ == str(v.path / v.library)
    x = torch.randn(4, 8)
    torch.testing.assert_close(modules[0].silu_and_mul_alloc(x), modules[1].silu_and_mul_alloc(x))
    torch.testing.assert_close(modules[2].relu2_alloc(x), ref_relu2(x))
    # Importing the same build again (as kernels.get_local_kernel would) is harmless.
    spec = importlib.util.spec_from_file_location(variants[4].module_id, variants[4].init_file)
    assert spec is not None and spec.loader is not None
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    torch.testing.assert_close(again.silu_and_mul_alloc(x), ref_silu_and_mul(x))


def test_kernels_get_local_kernel_loads_the_variants(built_examples: BuiltExamples):
    import kernels

    repo = built_examples.kernel("relu2", 2)
    mod = kernels.get_local_kernel(repo.path, backend="cpu")
    assert mod.__name__ == built_examples.variant("relu2", 2).module_id
    x = torch.randn(3, 4)
    torch.testing.assert_close(mod.relu2_and_mul_alloc(x), ref_relu2_and_mul(x))

    noarch = built_examples.variant("activation", 1, "torch-universal")
    mod = kernels.get_local_kernel(noarch.path)  # a variant folder works too
    assert mod.__name__ == noarch.module_id
    torch.testing.assert_close(mod.silu_and_mul_alloc(x), ref_silu_and_mul(x))
    loaded = {k.metadata.id for k in kernels.get_loaded_kernels()}
    assert {noarch.module_id, built_examples.variant("relu2", 2).module_id} <= loaded


# --------------------------------------------------------------------------- cache


def test_second_build_is_a_cache_hit(built_examples: BuiltExamples):
    so = built_examples.variant("activation", 1)
    before = (so.path / so.library).stat()  # type: ignore[operator]
    started = time.monotonic()
    again = kbuild.build_examples()
    elapsed = time.monotonic() - started
    assert again.cache_hit and elapsed < 1.0, elapsed
    assert again.root == built_examples.root and again.cache_key == built_examples.cache_key
    after = (so.path / so.library).stat()  # type: ignore[operator]
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_cache_dir_override_and_damaged_entry(
    built_examples: BuiltExamples, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache = tmp_path / "cache"
    shutil.copytree(built_examples.root, cache / built_examples.cache_key)
    monkeypatch.setenv(kbuild.CACHE_ENV, str(cache))
    hit = kbuild.build_examples()
    assert hit.cache_hit and hit.root == cache / built_examples.cache_key
    assert hit.variant("relu2", 1).path.is_relative_to(cache)
    # A changed file makes the entry invalid (and build_examples would rebuild it).
    init = hit.variant("relu2", 1).init_file
    init.write_text(init.read_text() + "\n")
    assert kbuild.load_cached_build(hit.root) is None


def test_cache_key_tracks_toolchain_and_sources():
    facts = kbuild.toolchain_facts()
    assert facts["torch"] == importlib.metadata.version("torch")
    key = kbuild.cache_key(facts)
    assert key == kbuild.cache_key(dict(facts))
    assert key != kbuild.cache_key({**facts, "torch": "9.9.9"})
    assert key != kbuild.cache_key({**facts, "compiler_version": "g++ 99"})


@pytest.mark.slow
def test_native_library_is_byte_reproducible(built_examples: BuiltExamples):
    """Rebuilding elsewhere gives the same bytes. Costs one more compile (~10-15 s), so it runs
    when asked (KERNELD_CHECK_REPRO=1) or when `build --check-repro` already stored a result."""
    stored = (built_examples.root / kbuild.REPRO_RESULT).is_file()
    if not stored and os.environ.get("KERNELD_CHECK_REPRO") != "1":
        pytest.skip("set KERNELD_CHECK_REPRO=1 to rebuild one library and compare its bytes")
    check = kbuild.check_reproducible(built_examples)
    assert check.reproducible, check


# --------------------------------------------------------------------------- git repos


def _check_repo_refs(hub: HubRoot) -> None:
    for repo in hub.repos:
        assert set(repo.branches) == {"main", "v1", "v2"}
        assert repo.tags == {"v1.0.0": repo.branches["v1"], "v2.0.0": repo.branches["v2"]}
        assert len(set(repo.branches.values())) == 3
        assert repo.path == hub.root / "kernels" / hub.org / repo.name


def test_hub_repos_layout_branches_and_versions(
    example_hub: HubRoot, built_examples: BuiltExamples
):
    _check_repo_refs(example_hub)
    assert example_hub.repo("kerneld-examples/activation").lfs
    assert not example_hub.repo("relu2").lfs
    arch = built_examples.arch_variant
    for repo in example_hub.repos:
        cwd = repo.path
        assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=cwd) == "main"
        assert git("status", "--porcelain", cwd=cwd) == ""
        # main carries v2's build; v1 and v2 differ and say so in _version.py.
        assert git("rev-parse", "main:build", cwd=cwd) == git("rev-parse", "v2:build", cwd=cwd)
        for version in (1, 2):
            kernel = built_examples.kernel(repo.name, version)
            listed = git("ls-tree", "-r", "--name-only", f"v{version}", "build", cwd=cwd)
            expected = sorted(f"build/{v.variant}/{f}" for v in kernel.variants for f in v.files)
            assert sorted(listed.splitlines()) == expected
            version_py = git("show", f"v{version}:build/{arch}/_version.py", cwd=cwd)
            assert f'__version__ = "{version}.0.0"' in version_py
        readme = git("show", "main:README.md", cwd=cwd)
        assert readme.startswith("---\nlibrary_name: kernels\n")


def test_hub_repo_lfs_objects(example_hub: HubRoot, built_examples: BuiltExamples):
    repo = example_hub.repo("activation")
    assert (repo.path / ".gitattributes").read_text().startswith("*.so filter=lfs")
    for version in (1, 2):
        v = built_examples.variant("activation", version)
        path = f"build/{v.variant}/{v.library}"
        assert path in repo.lfs_paths
        pointer = git("cat-file", "-p", f"v{version}:{path}", cwd=repo.path)
        assert pointer.splitlines()[:2] == [
            "version https://git-lfs.github.com/spec/v1",
            f"oid sha256:{v.library_sha256}",
        ]
        sha = v.library_sha256
        assert sha is not None
        obj = repo.lfs_objects_dir / sha[:2] / sha[2:4] / sha
        assert obj.read_bytes() == (v.path / v.library).read_bytes()  # type: ignore[operator]
    # The work tree holds the real library, not the pointer.
    v2 = built_examples.variant("activation", 2)
    assert (repo.path / "build" / v2.variant / v2.library).read_bytes()[:4] == b"\x7fELF"  # type: ignore[operator]

    plain = example_hub.repo("relu2")
    assert plain.lfs_paths == () and not (plain.path / ".gitattributes").exists()
    v = built_examples.variant("relu2", 1)
    blob = subprocess.run(
        ["git", "cat-file", "blob", f"v1:build/{v.variant}/{v.library}"],
        cwd=plain.path,
        capture_output=True,
        check=True,
    ).stdout
    assert blob == (v.path / v.library).read_bytes()  # type: ignore[operator]


def test_bare_hub_has_the_same_commits(example_hub: HubRoot, example_hub_bare: HubRoot):
    _check_repo_refs(example_hub_bare)
    for bare in example_hub_bare.repos:
        work = example_hub.repo(bare.name)
        assert bare.bare and bare.git_dir == bare.path
        assert git("rev-parse", "--is-bare-repository", cwd=bare.path) == "true"
        assert "[remote" not in (bare.path / "config").read_text()  # no path to the staging repo
        # Fixed authors and dates: built twice, the repos have identical commit shas.
        assert bare.branches == work.branches and bare.tags == work.tags
        assert bare.lfs_paths == work.lfs_paths
        objects = sorted(p.name for p in bare.lfs_objects_dir.rglob("*") if p.is_file())
        assert objects == sorted(p.name for p in work.lfs_objects_dir.rglob("*") if p.is_file())
        assert len(objects) == (2 if bare.lfs else 0)


def test_make_hub_root_replaces_existing_repos(tmp_path: Path, example_hub: HubRoot):
    root = kbuild.make_hub_root(tmp_path / "hub")  # builds (here: a cache hit) by itself
    assert root == tmp_path / "hub"
    junk = root / "kernels" / kbuild.ORG / "relu2" / "junk"
    junk.write_text("x")
    again = kbuild.make_hub(root)
    assert not junk.exists()
    assert again.repo("relu2").branches == example_hub.repo("relu2").branches
