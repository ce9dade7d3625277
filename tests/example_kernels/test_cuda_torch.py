"""kerneld with the registry's real CUDA torch and no device (issue 44): platform facts, the
daemon's ranking, the device check, the import of the CUDA example and kernelize take torch's
own values, not injected ones, except where a device is injected on purpose.

Opt-in (`make cuda-torch`): the venv holds torch 2.13.0+cu130 and its nvidia-* wheels (about
2.6 GB of wheels, 4.7 GB installed), which CI's default path must not download, and the CUDA
example is built with nvcc from the toolkit wheels (`make cuda-examples`). Skipped unless
KERNELD_CUDA_TORCH=1; KERNELD_CUDA_TORCH_PYTHON names the venv's python (default: the one
scripts/cuda-torch-venv makes). On a host with a GPU the no-device expectations do not hold,
so there the tests skip and scripts/gpu-check is the check.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.kernels.cuda.build import CudaBuild, build, variant_names, write_mirror
from tests.client.support import client_env
from tests.support.daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("cuda_torch_probe.py")
DEFAULT_PYTHON = ROOT / ".cache" / "cuda-torch" / "venv" / "bin" / "python"
#: The variant names of the example's CUDA 13.0 build: the CUDA torch 2.13.0 on the registry is
#: cu130, so these (not a cu12x name) are the ones it must choose.
LEGACY = "torch213-cxx11-cu130-x86_64-linux"
NEW = "torch-2.13-cxx11-cuda-13.0-cpython-3.9-abi3-x86_64-linux"

pytestmark = [
    pytest.mark.cuda_torch,
    pytest.mark.skipif(
        os.environ.get("KERNELD_CUDA_TORCH") != "1",
        reason="opt-in: needs the registry's CUDA torch (a few GB); run `make cuda-torch`",
    ),
]


@pytest.fixture(scope="module")
def cuda_python() -> Path:
    # absolute() and not resolve(): the venv's python is a link out of the venv
    python = Path(os.environ.get("KERNELD_CUDA_TORCH_PYTHON") or DEFAULT_PYTHON).absolute()
    if not python.is_file():
        pytest.fail(f"{python} is missing: scripts/cuda-torch-venv makes it (make cuda-torch)")
    return python


def probe(
    python: Path, args: dict[str, Any], env: dict[str, str], timeout: float = 180
) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), str(PROBE), json.dumps(args)],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


@pytest.fixture(scope="module")
def real_facts(cuda_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = client_env(None, tmp_path_factory.mktemp("facts"))
    got = probe(cuda_python, {"mode": "facts"}, env)
    if got["torch"]["is_available"]:
        pytest.skip("this host has a CUDA device: scripts/gpu-check is the check here")
    return got


@pytest.fixture(scope="module")
def cuda_build() -> CudaBuild:
    """The CUDA example, built with nvcc from the toolkit wheels (the CPU torch's headers)."""
    built = build(ROOT / ".cache" / "cuda-examples")
    assert {v.variant for v in built.variants} == {LEGACY, NEW} == set(variant_names())
    return built


def module_of(built: CudaBuild, variant: str) -> str:
    """The module (and op namespace) the variant's library defines."""
    return next(v.module_id for v in built.variants if v.variant == variant)


@pytest.fixture(scope="module")
def daemon(
    cuda_build: CudaBuild, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    """A real kerneld serving the CUDA example (both variant names) from a mirror directory."""
    work = tmp_path_factory.mktemp("cuda-torch")
    write_mirror(cuda_build, work / "mirror")
    with DaemonProcess(work / "daemon", mirror_dirs=[work / "mirror"]) as d:
        yield d


def job_env(daemon: DaemonProcess, tmp: Path, **extra: str) -> dict[str, str]:
    return client_env(daemon.store_root, tmp, KERNELD_SOCKET=str(daemon.user_socket), **extra)


def test_platform_facts_come_from_the_cuda_torch(real_facts: dict[str, Any]) -> None:
    torch, detected, facts = real_facts["torch"], real_facts["detected"], real_facts["facts"]
    assert "site-packages" in torch["file"] and ".venv" not in torch["file"]  # not the CPU wheel
    assert torch["version"] == "2.13.0+cu130" and torch["cuda"] == "13.0"
    assert torch["device_count"] == 0
    assert "NVIDIA driver" in torch["init_error"], torch["init_error"]  # torch names what's missing
    # kerneld's facts are torch's: its build's CUDA version (not a driver's: there is none), its
    # C++ ABI, and no device capability because torch sees no device.
    assert detected["backend"] == {"type": "cuda", "version": "13.0", "explicit": False}
    assert detected["cxx11_abi"] is torch["cxx11_abi"] is True
    assert detected["torch_version"] == "2.13"
    assert detected["device_capabilities"] == []
    assert facts["backend"]["type"] == "cuda" and facts["device_capabilities"] == []


def test_injected_facts_of_this_process_fingerprint_as_detected(
    cuda_python: Path, real_facts: dict[str, Any], tmp_path: Path
) -> None:
    """The injection gpu-check and these tests use (a `cu130` token, torch 2.13, cxx11) is what
    the real CUDA torch detects: same facts, same fingerprint, so injecting only adds a device."""
    injected = {"torch_version": "2.13", "cxx11_abi": True, "backend": "cu130"}
    env = client_env(None, tmp_path, KERNELD_PLATFORM_JSON=json.dumps(injected))
    got = probe(cuda_python, {"mode": "facts"}, env)
    assert got["facts"] == real_facts["facts"]
    assert got["fingerprint"] == real_facts["fingerprint"]


def _accepted(ranking: list[list[Any]]) -> list[str]:
    return [name for name, accepted, _rank, _why in ranking if accepted]


def test_no_device_the_cuda_variant_ranks_first_and_imports(
    cuda_python: Path,
    real_facts: dict[str, Any],
    cuda_build: CudaBuild,
    daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    """The example has CUDA builds only. With torch's real facts (CUDA 13.0, no device) both
    names fit, the 0.19 name first (as `kernels` 0.19 ranks them); the device check does not
    apply without a device (nor does it in `kernels`), so the variant is imported. Its ops
    then need a CUDA tensor, which torch refuses without a driver: that, not kerneld, is where
    a device-less CUDA process stops."""
    got = probe(cuda_python, {"mode": "resolve"}, job_env(daemon, tmp_path))
    assert got["facts"] == real_facts["facts"]  # the facts sent to the daemon: detected ones
    assert got["daemon"] == got["client"]  # the daemon ranks as the client's own rules do
    assert _accepted(got["daemon"]) == [NEW, LEGACY]
    assert got.get("import_error") is None, got["import_error"]
    assert got["imported"] == module_of(cuda_build, NEW)
    assert got["ops"] == ["rms_norm", "silu_and_mul"]
    assert got["cpu_call"].startswith("NotImplementedError") and "CUDA" in got["cpu_call"]
    assert "NVIDIA driver" in got["cuda_tensor"], got["cuda_tensor"]
    assert got["fallback_returned"] is False and got["warnings"] == []


@pytest.mark.parametrize(
    ("cap", "inject"), [("9.0", "env"), ("8.0", "env"), ("9.0", "api"), ("8.0", "api")]
)
def test_an_injected_device_chooses_and_imports_the_cuda_variant(
    cuda_python: Path,
    cuda_build: CudaBuild,
    daemon: DaemonProcess,
    tmp_path: Path,
    cap: str,
    inject: str,
) -> None:
    facts = {"torch_version": "2.13", "cxx11_abi": True, "backend": "cu130"}
    facts["device_capabilities"] = [cap]  # type: ignore[assignment]
    args: dict[str, Any] = {"mode": "resolve"}
    extra = {}
    if inject == "env":
        extra["KERNELD_PLATFORM_JSON"] = json.dumps(facts)
    else:
        args.update(inject="api", facts=facts)
    got = probe(cuda_python, args, job_env(daemon, tmp_path, **extra))
    assert got["facts"]["device_capabilities"] == [cap]
    assert got["daemon"] == got["client"]
    assert _accepted(got["daemon"]) == [NEW, LEGACY]
    # The library links cudart statically and opens libcuda.so.1 only on its first CUDA call,
    # so it imports without a driver; the device check passed (sm_80/sm_90 + PTX cover it).
    assert got.get("import_error") is None, got["import_error"]
    assert got["imported"] == module_of(cuda_build, NEW)
    assert got["ops"] == ["rms_norm", "silu_and_mul"]
    assert "NVIDIA driver" in got["cuda_tensor"], got["cuda_tensor"]
    assert got["fallback_returned"] is False and got["warnings"] == []


def test_an_injected_device_the_build_lacks_keeps_pytorch_with_one_warning(
    cuda_python: Path, daemon: DaemonProcess, tmp_path: Path
) -> None:
    """cc 7.5 is older than sm_80: the device check refuses before import, with the reason,
    and a job that passed a fallback gets it with one KernelFallbackWarning."""
    facts = {
        "torch_version": "2.13",
        "cxx11_abi": True,
        "backend": "cu130",
        "device_capabilities": ["7.5"],
    }
    env = job_env(daemon, tmp_path, KERNELD_PLATFORM_JSON=json.dumps(facts))
    got = probe(cuda_python, {"mode": "resolve"}, env)
    assert _accepted(got["daemon"]) == [NEW, LEGACY]  # the name fits; the archs do not
    assert "7.5 is not supported by the build's archs: 8.0+PTX, 9.0+PTX" in got["import_error"]
    assert got["fallback_returned"] is True
    assert [w[0] for w in got["warnings"]] == ["KernelFallbackWarning"], got["warnings"]
    assert "7.5 is not supported" in got["warnings"][0][1]


def test_kernelize_without_a_device_keeps_pytorch(
    cuda_python: Path, real_facts: dict[str, Any], daemon: DaemonProcess, tmp_path: Path
) -> None:
    """What a job on a host without a GPU does: kernelize(model) on its CPU model. The device
    is the model's (cpu), the mapping has the kernel for cuda only, so every layer keeps its
    PyTorch forward, silently (a mapping miss is not a failure) and computes the same."""
    got = probe(cuda_python, {"mode": "kernelize"}, job_env(daemon, tmp_path))
    assert got["cuda_available"] is False and got["device"] == "cpu"
    assert got["kernelized"] == {}
    assert sorted(got["kept"]) == ["0", "1"]
    for status, reason in got["kept"].values():
        assert status == "unmapped" and "with device type `cpu` (the mapping has: cuda)" in reason
    assert got["output_unchanged"] is True
    assert got["warnings"] == []


def test_kernelize_explicitly_for_cuda_without_a_device_swaps_in_the_cuda_kernel(
    cuda_python: Path, real_facts: dict[str, Any], daemon: DaemonProcess, tmp_path: Path
) -> None:
    """kernelize(model, device="cuda") on a CUDA torch without a device: the facts say CUDA
    13.0 and no device, so (as in `kernels`, whose arch check also returns without a device)
    the CUDA variant is chosen, imported and bound; the CPU model's forward then fails in the
    kernel's op, which has no CPU implementation. With the CPU torch the same call keeps
    PyTorch (no CUDA variant fits a CPU torch). Asserted as it is; see the issue 44 note."""
    got = probe(cuda_python, {"mode": "kernelize", "device": "cuda"}, job_env(daemon, tmp_path))
    assert got["cuda_available"] is False and got["device"] == "cuda"
    assert got["kernelized"] == {"0": NEW, "1": NEW}, got
    assert "output_unchanged" not in got
    assert got["forward_error"].startswith("NotImplementedError: Could not run"), got
    assert "with arguments from the 'CPU' backend" in got["forward_error"]
