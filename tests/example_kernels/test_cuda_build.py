"""The CUDA example kernels (issues 44, 53): activation-cuda and attention-cuda (the attention
example's GPU build) built with nvcc from the toolkit wheels, archs in the `.so` equal to
metadata's, importable on the CPU torch, served through a real daemon.

Opt-in (`make cuda-examples`): the build downloads about 100 MiB of CUDA wheels, which CI's
default path must not. Skipped unless KERNELD_CUDA_EXAMPLES=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.kernels.cuda.build import (
    ATTENTION_SPEC,
    SM_ARCHS,
    CudaBuild,
    build,
    check_archs,
    write_mirror,
)
from examples.kernels.cuda.fatbin import FatbinError, read_archs
from tests.client.support import client_env
from tests.support.daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.cuda_build,
    # A module fixture's nvcc build counts toward its first test: minutes on a loaded machine.
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("KERNELD_CUDA_EXAMPLES") != "1",
        reason="opt-in: downloads the CUDA toolkit wheels; run `make cuda-examples`",
    ),
]


# The builds go to this module's own folders: scripts/gpu-check, run by a test here, rebuilds
# into the default ones (default_out) while later tests still read these.
@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory: pytest.TempPathFactory) -> CudaBuild:
    return build(tmp_path_factory.mktemp("cuda") / "activation-cuda")


@pytest.fixture(scope="module")
def attention_build(tmp_path_factory: pytest.TempPathFactory) -> CudaBuild:
    return build(tmp_path_factory.mktemp("cuda") / "attention-cuda", ATTENTION_SPEC)


@pytest.mark.parametrize("which", ["activation", "attention"])
def test_both_variant_names_carry_sm80_sm90_cubins_and_ptx(
    which: str, request: pytest.FixtureRequest
) -> None:
    cuda_build: CudaBuild = request.getfixturevalue(
        "cuda_build" if which == "activation" else "attention_build"
    )
    names = sorted(v.variant for v in cuda_build.variants)
    assert names == [
        "torch-2.13-cxx11-cuda-13.0-cpython-3.9-abi3-x86_64-linux",
        "torch213-cxx11-cu130-x86_64-linux",
    ]
    for variant in cuda_build.variants:
        archs = read_archs(variant.path / str(variant.library))
        assert archs.cubins == frozenset(SM_ARCHS) and archs.ptx == frozenset(SM_ARCHS)
        declared, found = check_archs(variant.path)
        assert declared == found == ["8.0+PTX", "9.0+PTX"]
        metadata = json.loads((variant.path / "metadata.json").read_text())
        assert metadata["backend"]["type"] == "cuda"
        assert metadata["name"] == cuda_build.spec.name


def test_the_arch_check_catches_a_metadata_that_lies(cuda_build: CudaBuild, tmp_path: Path) -> None:
    variant = cuda_build.variants[0]
    lying = tmp_path / "variant"
    lying.mkdir()
    (lying / str(variant.library)).write_bytes((variant.path / str(variant.library)).read_bytes())
    metadata = json.loads((variant.path / "metadata.json").read_text())
    metadata["backend"]["archs"] = ["8.0", "9.0", "10.0"]
    (lying / "metadata.json").write_text(json.dumps(metadata))
    declared, found = check_archs(lying)
    assert declared != found
    (lying / "not-elf.so").write_bytes(b"MZ not an ELF file")
    with pytest.raises(FatbinError, match="not a little-endian ELF64"):
        read_archs(lying / "not-elf.so")


def test_the_library_needs_no_cuda_library_and_imports_on_cpu_torch(cuda_build: CudaBuild) -> None:
    variant = next(v for v in cuda_build.variants if v.variant.startswith("torch213"))
    library = variant.path / str(variant.library)
    needed = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert "libc10.so" in needed  # the check reads the real dynamic section
    for absent in ("libcudart", "libc10_cuda", "libtorch_cuda", "libcuda.so"):
        assert absent not in needed
    code = f"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location(
    {variant.module_id!r}, {str(variant.path / "__init__.py")!r},
    submodule_search_locations=[{str(variant.path)!r}])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
try:
    module.silu_and_mul_alloc(torch.randn(2, 8))
except NotImplementedError as e:
    print("refused:", "CUDA" in str(e) and "CPU" in str(e))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused: True"


def test_attention_cuda_is_the_attention_package_over_cuda_ops(attention_build: CudaBuild) -> None:
    """The same Python package as the CPU build (flash-attn's interface), its ops registered
    for CUDA only: it imports on the CPU torch and a CPU call is refused by torch's dispatcher."""
    variant = next(v for v in attention_build.variants if v.variant.startswith("torch213"))
    assert "flash_attn_interface.py" in variant.files
    code = f"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location(
    {variant.module_id!r}, {str(variant.path / "__init__.py")!r},
    submodule_search_locations=[{str(variant.path)!r}])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
print(sorted(n for n in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_forward",
                         "supports_flash_attn", "sageattn") if hasattr(module, n)))
q = torch.randn(1, 4, 2, 8)
try:
    module.flash_attn_func(q, q, q, causal=True)
except NotImplementedError as e:
    print("refused:", "CUDA" in str(e) and "CPU" in str(e))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['flash_attn_forward', 'flash_attn_func', 'flash_attn_varlen_func', 'sageattn', "
        "'supports_flash_attn']",
        "refused: True",
    ]


def test_gpu_check_dry_run_serves_and_resolves_the_cuda_variant(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--dry-run", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,  # it builds both kernels again, then a daemon and seven job processes
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for cap in ("9.0", "8.0"):
        row = next(line for line in lines if f"injected cc {cap}" in line)
        assert "cuda-13.0" in row and "import ok" in row and row.rstrip().endswith("ok")
    refused = next(line for line in lines if "injected cc 7.5" in line)
    assert "7.5 is not supported by the build's archs" in refused
    attention = next(line for line in lines if "attention-cuda, injected cc 9.0" in line)
    assert "import ok" in attention and "flash_attn_func" in attention, attention
    assert attention.rstrip().endswith("ok")
    refused = next(line for line in lines if "attention-cuda, injected cc 7.5" in line)
    assert "7.5 is not supported by the build's archs" in refused
    kept = next(line for line in lines if "kernelize for cuda, no device" in line)
    assert "kept PyTorch, output unchanged: True" in kept
    assert "FAIL" not in done.stdout


@pytest.fixture(scope="module")
def served(
    cuda_build: CudaBuild, attention_build: CudaBuild, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    """A real kerneld serving both CUDA examples from a mirror directory."""
    work = tmp_path_factory.mktemp("cuda-archs")
    write_mirror([cuda_build, attention_build], work / "mirror")
    with DaemonProcess(work / "daemon", mirror_dirs=[work / "mirror"]) as d:
        yield d


#: A job's loaders, each with and without check_arch, in a process whose device is injected.
CHECK_ARCH_JOB = """
import json, sys
import kerneld_client as kc

repo, root = sys.argv[1], sys.argv[2]
loaders = {
    "get_kernel": lambda **kw: kc.get_kernel(repo, revision="main", policy="error", **kw),
    "has_kernel": lambda **kw: kc.has_kernel(repo, revision="main", **kw),
    "get_local_kernel": lambda **kw: kc.get_local_kernel(root, **kw),
    "LayerRepository": lambda **kw: kc.LayerRepository(
        repo, revision="main", layer_name="FlashAttention", **kw).load(),
    "LocalLayerRepository": lambda **kw: kc.LocalLayerRepository(
        root, layer_name="FlashAttention", **kw).load(),
}
out = {}
for name, load in loaders.items():
    for check in (True, False):
        try:
            got = load(check_arch=check)
            out[f"{name} {check}"] = got if isinstance(got, bool) else True
        except Exception as exc:
            out[f"{name} {check}"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    ("capability", "supported"),
    [("8.0", True), ("8.6", True), ("9.0", True), ("12.0", True), ("7.5", False)],
)
def test_check_arch_reads_the_real_builds_archs(
    capability: str,
    supported: bool,
    attention_build: CudaBuild,
    served: DaemonProcess,
    tmp_path: Path,
) -> None:
    """check_arch against what the build really carries: metadata `archs` read back from the
    `.so`'s fat binary (8.0+PTX, 9.0+PTX), a device injected as gpu-check injects one
    (KERNELD_PLATFORM_JSON), every loader that takes check_arch, through the daemon and from the
    build's own folder. 8.6 runs the 8.0 cubin, 12.0 the PTX; 7.5 is refused before import,
    unless check_arch=False."""
    facts = {"torch_version": "2.13", "cxx11_abi": True, "backend": "cu130"}
    env = client_env(
        served.store_root,
        tmp_path,
        KERNELD_SOCKET=str(served.user_socket),
        KERNELD_PLATFORM_JSON=json.dumps({**facts, "device_capabilities": [capability]}),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHECK_ARCH_JOB,
            "kerneld-examples/attention-cuda",
            str(attention_build.root),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for name in (
        "get_kernel",
        "has_kernel",
        "get_local_kernel",
        "LayerRepository",
        "LocalLayerRepository",
    ):
        assert out[f"{name} False"] is True, (name, out)  # the opt-out imports it anyway
        checked = out[f"{name} True"]
        if supported:
            assert checked is True, (name, out)
        elif name == "has_kernel":
            assert checked is False, out
        else:
            assert isinstance(checked, str), (name, out)
            assert f"CUDA capability {capability} is not supported by the build's archs" in checked
            assert "8.0+PTX, 9.0+PTX" in checked, checked
