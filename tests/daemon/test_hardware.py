"""GPU detection from fake /proc and /sys trees, and which variants prefetch picks for each host."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kerneld.pipeline.hardware import Hardware, cuda_for_driver, detect, gfx_name, nvidia_capability
from kerneld.pipeline.prefetch import ClientPlatforms, host_backends, plan_variants
from kerneld_client.device_names import normalise_machine
from kerneld_client.variants import Backend, BackendType, PlatformFacts
from tests.daemon import fakehosts
from tests.fixtures_daemon import MULTI_VARIANTS

T213 = [(2, 13)]


def test_cpu_only_host(tmp_path: Path) -> None:
    hw = detect(fakehosts.cpu_only(tmp_path), machine="x86_64")
    assert hw.gpus == ()
    assert hw.cuda_driver is None and hw.rocm is None
    assert hw.backends() == [Backend(BackendType.CPU)]
    assert hw.cpu == "x86_64" and hw.os == "linux"


def test_empty_root_is_cpu_only(tmp_path: Path) -> None:
    assert detect(tmp_path, machine="aarch64").gpus == ()


@pytest.mark.parametrize("machine", ["x86_64", "aarch64", "arm64", "AMD64", "ppc64le"])
def test_the_daemon_names_the_machine_as_the_client_does(tmp_path: Path, machine: str) -> None:
    """One rule (kerneld_client.device_names): a daemon that spelt the machine otherwise would
    prefetch variants no client on the host asks for."""
    hw = detect(tmp_path, machine=machine)
    assert hw.cpu == normalise_machine(machine, hw.os)


def test_nvidia_host(tmp_path: Path) -> None:
    hw = detect(fakehosts.nvidia(tmp_path, driver="570.86.15"), machine="x86_64")
    assert [g.vendor for g in hw.gpus] == ["nvidia", "nvidia"]
    assert hw.capabilities("nvidia") == ("9.0",)
    assert hw.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert hw.nvidia_driver == "570.86.15"
    assert hw.cuda_driver == (12, 8)
    assert Backend(BackendType.CUDA, (12, 8)) in hw.backends()
    assert "nvidia=2x9.0" in hw.summary() and "cuda_driver=12.8" in hw.summary()


def test_nvidia_module_version_fallback(tmp_path: Path) -> None:
    fakehosts.nvidia(tmp_path, driver="580.65.06", models=("NVIDIA L4",))
    (tmp_path / "proc/driver/nvidia/version").unlink()
    hw = detect(tmp_path)
    assert hw.nvidia_driver == "580.65.06"
    assert hw.cuda_driver == (13, 0)
    assert hw.capabilities("nvidia") == ("8.9",)


def test_nvidia_without_driver_has_no_cuda(tmp_path: Path) -> None:
    hw = detect(fakehosts.nvidia_without_driver(tmp_path))
    assert [g.vendor for g in hw.gpus] == ["nvidia"]
    assert hw.cuda_driver is None
    assert host_backends(hw, MULTI_VARIANTS) == [Backend(BackendType.CPU)]


def test_amd_host(tmp_path: Path) -> None:
    hw = detect(fakehosts.amd(tmp_path, targets=(90402, 90010)))
    assert [g.capability for g in hw.gpus] == ["gfx942", "gfx90a"]
    assert hw.rocm == (6, 4)
    assert Backend(BackendType.ROCM, (6, 4)) in hw.backends()


def test_intel_host(tmp_path: Path) -> None:
    hw = detect(fakehosts.intel(tmp_path))
    assert [(g.vendor, g.location) for g in hw.gpus] == [("intel", "card0")]
    assert Backend(BackendType.XPU) in hw.backends()


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("590.44.01", (13, 1)),
        ("580.65.06", (13, 0)),
        ("575.51.03", (12, 9)),
        ("570.26", (12, 8)),
        ("570.25.99", (12, 6)),
        ("550.54.14", (12, 4)),
        ("535.104.05", (12, 2)),
        ("450.36.06", (11, 0)),
        ("440.33", None),
        ("garbage", None),
    ],
)
def test_cuda_version_of_driver(driver: str, cuda: tuple[int, int] | None) -> None:
    assert cuda_for_driver(driver) == cuda


@pytest.mark.parametrize(
    ("target", "name"),
    [(90402, "gfx942"), (90010, "gfx90a"), (110000, "gfx1100"), (120001, "gfx1201")],
)
def test_gfx_names(target: int, name: str) -> None:
    assert gfx_name(target) == name


def test_nvidia_capability_names() -> None:
    assert nvidia_capability("NVIDIA A100-SXM4-80GB") == "8.0"
    assert nvidia_capability("NVIDIA A10G") == "8.6"
    assert nvidia_capability("NVIDIA GeForce RTX 4090") == "8.9"
    assert nvidia_capability("NVIDIA B200") == "10.0"
    assert nvidia_capability("Mystery Accelerator") == ""


# ---- which variants each host prefetches --------------------------------------------------------


def plan(hw: Hardware, torch: list[tuple[int, int]] = T213, **kw: object) -> set[str]:
    return set(plan_variants(MULTI_VARIANTS, hardware=hw, torch_versions=torch, **kw))  # type: ignore[arg-type]


def test_cpu_host_prefetches_cpu_builds(tmp_path: Path) -> None:
    hw = detect(fakehosts.cpu_only(tmp_path), machine="x86_64")
    assert plan(hw) == {"torch213-cxx11-cpu-x86_64-linux", "torch-cpu"}
    assert plan(hw, [(2, 12), (2, 13)]) == {
        "torch212-cxx11-cpu-x86_64-linux",
        "torch213-cxx11-cpu-x86_64-linux",
        "torch-cpu",
    }


def test_new_format_builds_are_planned_for_the_pythons_clients_showed(tmp_path: Path) -> None:
    """kernels 0.19 names carry a minimum Python: what a 3.12 job loads is prefetched once a
    3.12 client was seen, even by a daemon that runs another Python."""
    hw = detect(fakehosts.cpu_only(tmp_path), machine="x86_64")
    names = [
        "torch-2.13-cxx11-cpu-cpython-3.12-abi3-x86_64-linux",
        "torch-2.13-cxx11-cpu-cpython-3.9-abi3-x86_64-linux",
    ]
    client = PlatformFacts(
        cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True, python_version=(3, 12, 1)
    )
    old = replace(client, python_version=(3, 10, 0))
    got = set(plan_variants(names, hardware=hw, torch_versions=[(2, 13)], client_platforms=[old]))
    assert got == {names[1]}
    got = set(
        plan_variants(names, hardware=hw, torch_versions=[(2, 13)], client_platforms=[client, old])
    )
    assert got == set(names)


def test_arm_host_takes_its_own_cpu_builds(tmp_path: Path) -> None:
    hw = detect(tmp_path, machine="aarch64")
    assert plan(hw) == {"torch213-cxx11-cpu-aarch64-linux", "torch-cpu"}


def test_nvidia_host_prefetches_cuda_builds_the_driver_runs(tmp_path: Path) -> None:
    hw = detect(fakehosts.nvidia(tmp_path, driver="570.86.15"), machine="x86_64")
    assert plan(hw) == {
        "torch213-cxx11-cpu-x86_64-linux",
        "torch213-cxx11-cu126-x86_64-linux",
        "torch213-cxx11-cu128-x86_64-linux",  # cu130 needs a newer driver
        "torch-cpu",
        "torch-cuda",
    }


def test_new_driver_gets_cuda_13(tmp_path: Path) -> None:
    hw = detect(fakehosts.nvidia(tmp_path, driver="580.82.07"), machine="x86_64")
    assert "torch213-cxx11-cu130-x86_64-linux" in plan(hw)


def test_amd_host_prefetches_its_rocm_minor(tmp_path: Path) -> None:
    hw = detect(fakehosts.amd(tmp_path, rocm="6.4.1-83"), machine="x86_64")
    assert plan(hw) == {
        "torch213-cxx11-cpu-x86_64-linux",
        "torch213-cxx11-rocm64-x86_64-linux",  # rocm63 loads too; the newest minor wins
        "torch-cpu",
        "torch-rocm",
    }


def test_amd_host_without_rocm_version_takes_noarch_only(tmp_path: Path) -> None:
    hw = detect(fakehosts.amd(tmp_path, rocm=None), machine="x86_64")
    assert plan(hw) == {"torch213-cxx11-cpu-x86_64-linux", "torch-cpu", "torch-rocm"}


def test_intel_host_prefetches_noarch_xpu_and_what_clients_use(tmp_path: Path) -> None:
    hw = detect(fakehosts.intel(tmp_path), machine="x86_64")
    assert plan(hw) == {"torch213-cxx11-cpu-x86_64-linux", "torch-cpu", "torch-xpu"}
    client = PlatformFacts(
        cpu="x86_64",
        os="linux",
        torch_version=(2, 13),
        cxx11_abi=True,
        backend=Backend(BackendType.XPU, (2025, 2)),
    )
    assert "torch213-cxx11-xpu20252-x86_64-linux" in plan(hw, client_platforms=[client])


def test_no_torch_configured_means_newest(tmp_path: Path) -> None:
    hw = detect(tmp_path, machine="x86_64")
    assert plan(hw, []) == {"torch213-cxx11-cpu-x86_64-linux", "torch-cpu"}


def test_client_platforms_add_their_variants(tmp_path: Path) -> None:
    hw = detect(tmp_path, machine="x86_64")  # a CPU-only host serving a CUDA client's shape
    client = PlatformFacts(
        cpu="x86_64",
        os="linux",
        torch_version=(2, 12),
        cxx11_abi=True,
        backend=Backend(BackendType.CUDA, (12, 9)),
    )
    assert "torch212-cxx11-cu128-x86_64-linux" in plan(hw, client_platforms=[client])


def test_explicit_platforms_replace_detection(tmp_path: Path) -> None:
    hw = detect(fakehosts.nvidia(tmp_path), machine="x86_64")
    only = PlatformFacts(cpu="aarch64", os="linux", torch_version=(2, 13), cxx11_abi=True)
    assert plan(hw, platforms=[only]) == {"torch213-cxx11-cpu-aarch64-linux"}


def test_client_platforms_are_remembered(tmp_path: Path) -> None:
    path = tmp_path / "platforms.json"
    seen = ClientPlatforms(path, limit=2)
    facts = [
        PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, t), cxx11_abi=True)
        for t in (11, 12, 13)
    ]
    assert seen.record(facts[0]) is True
    assert seen.record(facts[0]) is False  # the same platform again: nothing new
    seen.record(facts[1])
    seen.record(facts[2])  # over the limit: the least recently seen goes
    again = ClientPlatforms(path)
    assert again.torch_versions() == {(2, 12), (2, 13)}
