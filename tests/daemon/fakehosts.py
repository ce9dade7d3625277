"""Fake /proc and /sys trees of hosts with NVIDIA, AMD and Intel GPUs (for `--hardware-root`).

Only the files `kerneld.pipeline.hardware` reads, with the contents the real drivers write.
"""

from __future__ import annotations

from pathlib import Path


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _pci(root: Path, address: str, vendor: int, device: int, cls: int) -> None:
    base = f"sys/bus/pci/devices/{address}"
    _write(root, f"{base}/vendor", f"{vendor:#06x}\n")
    _write(root, f"{base}/device", f"{device:#06x}\n")
    _write(root, f"{base}/class", f"{cls:#08x}\n")


def cpu_only(root: Path) -> Path:
    """A host with a non-GPU PCI device and an Intel host bridge (class 0x06): no GPU."""
    _pci(root, "0000:00:00.0", 0x8086, 0x1237, 0x060000)
    _pci(root, "0000:00:03.0", 0x1AF4, 0x1000, 0x020000)
    (root / "sys/class/drm").mkdir(parents=True, exist_ok=True)
    return root


def nvidia(root: Path, *, driver: str = "570.86.15", models: tuple[str, ...] = ()) -> Path:
    """An NVIDIA host with a loaded driver: /proc/driver/nvidia/{version,gpus/*/information}."""
    models = models or ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
    _write(
        root,
        "proc/driver/nvidia/version",
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 20:46:22 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
    )
    for i, model in enumerate(models):
        address = f"0000:{0x18 + i:02x}:00.0"
        _write(
            root,
            f"proc/driver/nvidia/gpus/{address}/information",
            f"Model: \t\t {model}\nIRQ:   \t\t 123\nGPU UUID: \t GPU-{i:08d}\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"Bus Location: \t {address}\nDevice Minor: \t {i}\n",
        )
        _pci(root, address, 0x10DE, 0x2330, 0x030200)
    _write(root, "sys/module/nvidia/version", f"{driver}\n")
    return root


def nvidia_without_driver(root: Path) -> Path:
    """An NVIDIA card on the PCI bus but no driver loaded (no /proc/driver/nvidia)."""
    _pci(root, "0000:3b:00.0", 0x10DE, 0x20B0, 0x030200)
    return root


def amd(
    root: Path, *, targets: tuple[int, ...] = (90402, 90402), rocm: str | None = "6.4.1-83"
) -> Path:
    """An AMD host: KFD topology (node 0 is the CPU) and optionally /opt/rocm/.info/version."""
    nodes = "sys/class/kfd/kfd/topology/nodes"
    _write(
        root, f"{nodes}/0/properties", "cpu_cores_count 64\nsimd_count 0\ngfx_target_version 0\n"
    )
    for i, target in enumerate(targets, start=1):
        _write(
            root,
            f"{nodes}/{i}/properties",
            f"cpu_cores_count 0\nsimd_count 1216\nmax_waves_per_simd 8\n"
            f"gfx_target_version {target}\nvendor_id 4098\ndevice_id 29856\n"
            f"location_id {i * 256}\n",
        )
        _write(root, f"{nodes}/{i}/name", "\n")
        _pci(root, f"0000:{0x10 + i:02x}:00.0", 0x1002, 0x74A1, 0x038000)
    if rocm is not None:
        _write(root, "opt/rocm/.info/version", f"{rocm}\n")
    return root


def intel(root: Path) -> Path:
    """An Intel GPU (DRM card with vendor 0x8086) plus its connector entries."""
    _write(root, "sys/class/drm/card0/device/vendor", "0x8086\n")
    _write(root, "sys/class/drm/card0/device/device", "0x0bd5\n")
    (root / "sys/class/drm/card0-DP-1").mkdir(parents=True)
    (root / "sys/class/drm/renderD128").mkdir(parents=True)
    return root
