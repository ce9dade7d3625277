"""What the variant tests share: platform facts builders, named platforms, the corpus of variant
names (well-formed over every framework, backend and system, and malformed) and the hypothesis
strategy for platform facts."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import strategies as st

from kerneld_client.variants import Backend, BackendType, Decision, PlatformFacts, decide

B = BackendType
CPU = Backend(B.CPU)


def cuda(major: int, minor: int) -> Backend:
    return Backend(B.CUDA, (major, minor))


def facts(**kw: object) -> PlatformFacts:
    """Linux x86_64, CPU torch 2.13 cxx11, CPython 3.11 unless overridden."""
    base: dict[str, object] = {
        "cpu": "x86_64",
        "os": "linux",
        "torch_version": (2, 13),
        "cxx11_abi": True,
        "backend": CPU,
        "python_version": (3, 11, 7),
    }
    base.update(kw)
    return PlatformFacts(**base)  # type: ignore[arg-type]


def accepted(names: list[str], f: PlatformFacts) -> list[str]:
    return [d.variant for d in decide(names, f) if d.accepted]


def verdict(name: str, f: PlatformFacts) -> Decision:
    (d,) = decide([name], f)
    return d


# Named platforms.

F_CPU = facts()
F_CU128 = facts(torch_version=(2, 9), backend=cuda(12, 8))
F_CU130 = facts(backend=cuda(13, 0))
F_ROCM = facts(torch_version=(2, 10), backend=Backend(B.ROCM, (6, 4)))
F_XPU = facts(torch_version=(2, 9), backend=Backend(B.XPU, (2025, 3)))
F_CANN = facts(torch_version=(2, 8), cpu="aarch64", backend=Backend(B.CANN, (8, 1)))
F_MAC = facts(
    cpu="aarch64", os="darwin", cxx11_abi=None, backend=Backend(B.METAL), macos_version=(26, 1)
)
F_OLD_MAC = replace(F_MAC, macos_version=(15, 5))
F_WIN = facts(os="windows", cxx11_abi=None, backend=cuda(12, 6))
F_NO_TORCH = facts(torch_version=None, cxx11_abi=None)
F_FT313 = facts(free_threaded=True, python_version=(3, 13, 1), backend=cuda(12, 8))
F_FT315 = facts(free_threaded=True, python_version=(3, 15, 0))
F_TVM = facts(backend=cuda(12, 8), tvm_ffi_version=(0, 1))


# Names no parser may accept (test_parsing.py checks each; ALL_NAMES mixes them in).
MALFORMED = [
    "",
    "torch",
    "torch-",
    "torch-foo",
    "torch-cuda-extra",
    "torch-stable",
    "torch-universal-x",
    "torch213",
    "torch213-cxx11",
    "torch213-cxx11-cpu-x86_64",
    "torch213-cxx11-cpu-x86_64-linux-extra",
    "torch213-CPU-x86_64-linux",
    "torch213-cuda-x86_64-linux",
    "torch213-cu-x86_64-linux",
    "torch213-cu1-x86_64-linux",
    "torch213-npu-x86_64-linux",
    "torchX-cpu-x86_64-linux",
    "torch2-cpu-x86_64-linux",
    "torch2१3-cpu-x86_64-linux",
    "torch-stable-abi2-cpu-x86_64-linux",
    "torch-stable-abi210",
    "tvm-ffi1-cpu-x86_64-linux",
    "tvm-ffix-cpu-x86_64-linux",
    "tvm-cpu-x86_64-linux",
    "cu128",
    "build",
    "__pycache__",
    "metadata.json",
    "Torch213-cpu-x86_64-linux",
    "torch213-cxx11-cu13a-x86_64-linux",
]


# Every name the grammar knows, crossed, plus the noarch names and the malformed ones.

FRAMEWORKS = [
    "torch28",
    "torch29",
    "torch210",
    "torch213",
    "torch212-cxx11",
    "torch213-cxx11",
    "torch213-cxx98",
    "torch29-cxx11",
    "torch210-cxx11",
    "torch-stable-abi28",
    "torch-stable-abi29",
    "torch-stable-abi210",
    "torch-stable-abi213",
    "torch-stable-abi214",
    "tvm-ffi01",
    "tvm-ffi02",
]
BACKENDS = [
    "cpu",
    "cu118",
    "cu120",
    "cu126",
    "cu128",
    "cu129",
    "cu130",
    "cu131",
    "rocm63",
    "rocm64",
    "xpu20252",
    "xpu20253",
    "cann80",
    "cann81",
    "metal",
    "neuron",
    "tpu",
]
SYSTEMS = ["x86_64-linux", "aarch64-linux", "aarch64-darwin", "x86_64-windows"]
NOARCH = [f"torch-{b}" for b in ("cpu", "cuda", "rocm", "xpu", "npu", "cann", "metal", "neuron")]
ALL_NAMES = [
    *(f"{fw}-{be}-{sy}" for fw, be, sy in itertools.product(FRAMEWORKS, BACKENDS, SYSTEMS)),
    *NOARCH,
    "torch-universal",
    "torch-tpu",
    *MALFORMED,
    "torch2013-cpu-x86_64-linux",
    "torch213-rocm064-x86_64-linux",
    # Spelled like a local backend with a two-digit minor (ROCm 7.14, CANN 8.10, XPU 2025.10),
    # which `kernels` reads with a one-digit minor (ROCm 71.4, ...).
    "torch210-cxx11-rocm714-x86_64-linux",
    "torch28-cxx11-cann810-aarch64-linux",
    "torch29-cxx11-xpu202510-x86_64-linux",
]

# New-format names (`kernels` 0.19), crossed over every part, and malformed ones; EVERY_NAME
# mixes them with the legacy corpus (ALL_NAMES is what `kernels` 0.17.2 knows).

NEW_FRAMEWORKS = [
    "torch-2.13",
    "torch-2.13-cxx11",
    "torch-2.9-cxx98",
    "torch-stable-abi-2.9",
    "torch-stable-abi-2.14",
    "tvm-ffi-0.1",
]
NEW_BACKENDS = [
    "cpu",
    "cuda-12.8",
    "cuda-13.0",
    "rocm-6.3",
    "rocm-6.4",
    "xpu-2025.3",
    "cann-8.1",
    "metal",
    "tpu",
]
PYTHONS = ["cpython-3.9-abi3", "cpython-3.12-abi3", "cpython-3.15-abi3t"]
NEW_SYSTEMS = ["x86_64-linux", "aarch64-linux", "aarch64-darwin"]
SDK_NAMES = [
    "sdk",
    *(f"sdk-{b}" for b in ("cpu", "cuda", "rocm", "metal", "xpu", "cann", "npu")),
    *(
        f"sdk-{b}{py}-{sy}"
        for b, py, sy in itertools.product(
            ["", "cpu-", "cuda-12.8-", "cuda-13.0-", "rocm-6.4-"], PYTHONS, NEW_SYSTEMS
        )
    ),
]
MLX_NAMES = ["mlx-metal", "mlx-cpu", "mlx-cuda", "mlx-cann", "mlx-npu", "mlx-universal"]
NEW_MALFORMED = [
    "torch-2.13-cpu-x86_64-linux",
    "torch-2.13-cpu-cpython-3.12-abi3t-x86_64-linux",
    "torch-2.13-cpu-cpython-3-abi3-x86_64-linux",
    "torch-2.13-cpu-cpython-3.9-abi4-x86_64-linux",
    "torch-2.13-cpu-pypy-3.9-abi3-x86_64-linux",
    "torch-2.13-cu128-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cuda-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cuda-12-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-npu-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cpu-cpython-3.9-abi3-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cpu-cpython-3.9-abi3-x86_64",
    "torch-2-cpu-cpython-3.9-abi3-x86_64-linux",
    "torch-2.x-cpu-cpython-3.9-abi3-x86_64-linux",
    "torch-2.13-cpu-cpython-३.9-abi3-x86_64-linux",
    "torch-stable-abi-2.11-cpu-x86_64-linux",
    "torch-stable-abi-2-cpu-cpython-3.9-abi3-x86_64-linux",
    "tvm-ffi-0.1-cpu-x86_64-linux",
    "tvm-ffi-cpu-cpython-3.9-abi3-x86_64-linux",
    "sdk-cuda-12.8",
    "sdk-cpu-extra",
    "sdk-cuda-x86_64-linux",
    "sdk-cpython-3.9-abi3",
    "sdk-cpython-3.9-abi3-x86_64",
    "sdk-foo",
    "sdk-universal",
    "mlx",
    "mlx-",
    "mlx-foo",
    "mlx-0.1-metal",
]
NEW_NAMES = [
    *(
        f"{fw}-{be}-{py}-{sy}"
        for fw, be, py, sy in itertools.product(NEW_FRAMEWORKS, NEW_BACKENDS, PYTHONS, NEW_SYSTEMS)
    ),
    *SDK_NAMES,
    *MLX_NAMES,
    *NEW_MALFORMED,
    "torch-2.013-cpu-cpython-3.09-abi3-x86_64-linux",
    "torch-10.0-cpu-cpython-3.9-abi3-x86_64-linux",
    "rocm-7.14",
    "torch-2.13-rocm-7.14-cpython-3.9-abi3-x86_64-linux",
]
EVERY_NAME = [*ALL_NAMES, *NEW_NAMES]

BACKEND_FACTS = st.one_of(
    st.just(CPU),
    st.builds(
        Backend, st.just(B.CUDA), st.tuples(st.sampled_from([11, 12, 13]), st.integers(0, 9))
    ),
    st.builds(Backend, st.just(B.ROCM), st.tuples(st.sampled_from([6, 7]), st.integers(0, 5))),
    st.builds(Backend, st.just(B.XPU), st.tuples(st.just(2025), st.integers(0, 3))),
    st.builds(Backend, st.just(B.CANN), st.tuples(st.just(8), st.integers(0, 2))),
    st.sampled_from([Backend(B.METAL), Backend(B.NEURON), Backend(B.TPU)]),
)
FACTS = st.builds(
    PlatformFacts,
    cpu=st.sampled_from(["x86_64", "aarch64"]),
    os=st.sampled_from(["linux", "darwin", "windows"]),
    torch_version=st.one_of(st.none(), st.tuples(st.just(2), st.integers(7, 15))),
    cxx11_abi=st.one_of(st.none(), st.booleans()),
    backend=BACKEND_FACTS,
    backend_explicit=st.booleans(),
    free_threaded=st.booleans(),
    python_version=st.tuples(st.just(3), st.integers(10, 16), st.integers(0, 9)),
    macos_version=st.one_of(st.none(), st.tuples(st.integers(13, 27), st.integers(0, 5))),
    tvm_ffi_version=st.one_of(st.none(), st.tuples(st.just(0), st.integers(0, 3))),
    device_capabilities=st.lists(st.sampled_from(["8.0", "9.0", "10.0", "gfx942"]), max_size=2).map(
        tuple
    ),
    mlx=st.booleans(),
)
