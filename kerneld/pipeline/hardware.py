"""What GPUs this host has, found without importing torch (for prefetch and `GetStatus`).

The daemon never imports torch, and a training process's torch is not the host's: so the host
answers "which backends can run here", and prefetch fetches the variants for those backends.

Sources, all read under a `root` directory so tests (and containers that mount the host's /proc
and /sys elsewhere) can point detection at a fake tree:

- NVIDIA: NVML (`pynvml` from nvidia-ml-py, a dependency; the library comes with the driver;
  used with root "/" only) gives the driver's CUDA
  version and each device's compute capability. Without it: the driver version from
  `proc/driver/nvidia/version` (or `sys/module/nvidia/version`), mapped to the newest CUDA
  version that driver supports; devices from `proc/driver/nvidia/gpus/*/information`, else PCI
  display controllers with vendor 0x10de under `sys/bus/pci/devices`; the compute capability
  from the model name (NVML is exact; the name table covers data-center and recent desktop GPUs).
- AMD: `sys/class/kfd/kfd/topology/nodes/*/properties`, `gfx_target_version` -> `gfxNNNN`;
  the ROCm version from `opt/rocm/.info/version` when ROCm is installed.
- Intel: `sys/class/drm/card*/device/vendor` == 0x8086. The XPU toolkit version cannot be read
  from the host (torch XPU wheels bring their own runtime): XPU arch variants are prefetched for
  the versions clients have shown, noarch `torch-xpu` always.
- CPU: always; `platform.machine()` as variant names spell it (`kerneld_client.vocabulary`,
  the client's rule, so both compute the same fingerprint).
"""

from __future__ import annotations

import importlib
import logging
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneld_client.device_names import cuda_capability, normalise_machine, rocm_target
from kerneld_client.variants import Backend, BackendType, PlatformFacts

log = logging.getLogger("kerneld.hardware")

NVIDIA_VENDOR = 0x10DE
AMD_VENDOR = 0x1002
INTEL_VENDOR = 0x8086

#: Minimum Linux driver version of each CUDA toolkit release (CUDA release notes, table
#: "CUDA Toolkit and Corresponding Driver Versions"); newest first.
CUDA_DRIVER_MINIMUM: tuple[tuple[tuple[int, int], tuple[int, ...]], ...] = (
    ((13, 1), (590, 44, 1)),
    ((13, 0), (580, 65, 6)),
    ((12, 9), (575, 51, 3)),
    ((12, 8), (570, 26)),
    ((12, 6), (560, 28, 3)),
    ((12, 5), (555, 42, 2)),
    ((12, 4), (550, 54, 14)),
    ((12, 3), (545, 23, 6)),
    ((12, 2), (535, 54, 3)),
    ((12, 1), (530, 30, 2)),
    ((12, 0), (525, 60, 13)),
    ((11, 8), (520, 61, 5)),
    ((11, 7), (515, 43, 4)),
    ((11, 6), (510, 39, 1)),
    ((11, 5), (495, 29, 5)),
    ((11, 4), (470, 42, 1)),
    ((11, 3), (465, 19, 1)),
    ((11, 2), (460, 27, 3)),
    ((11, 1), (455, 23)),
    ((11, 0), (450, 36, 6)),
)

#: Compute capability by model name (first match wins); NVML reports it exactly.
_NVIDIA_MODELS: tuple[tuple[str, str], ...] = (
    (r"GB300|B300", "10.3"),
    (r"GB200|B200|B100", "10.0"),
    (r"RTX PRO \d+ Blackwell|RTX 50\d0", "12.0"),
    (r"GH200|H200|H100|H800|H20\b", "9.0"),
    (r"Orin", "8.7"),
    (r"L40|L4\b|L20\b|RTX 40\d0|RTX \d+ Ada", "8.9"),
    (r"A100|A800|A30\b", "8.0"),
    (r"A10G?\b|A40\b|A16\b|A2\b|RTX A\d+|RTX 30\d0", "8.6"),
    (r"T4\b|RTX 20\d0|Quadro RTX|TITAN RTX", "7.5"),
    (r"V100|TITAN V\b", "7.0"),
    (r"P100", "6.0"),
    (r"P40\b|P4\b|GTX 10\d0", "6.1"),
)


@dataclass(frozen=True)
class Gpu:
    vendor: str
    """nvidia | amd | intel"""
    name: str
    capability: str = ""
    """CUDA compute capability (`9.0`) or ROCm gfx target (`gfx942`); empty when unknown."""
    location: str = ""
    """PCI address or sysfs node, for logs."""


@dataclass(frozen=True)
class Hardware:
    """The host's devices and driver facts, as far as they can be read."""

    cpu: str
    os: str
    gpus: tuple[Gpu, ...] = ()
    nvidia_driver: str | None = None
    cuda_driver: tuple[int, int] | None = None
    """The newest CUDA version the NVIDIA driver runs (older toolkits run too)."""
    rocm: tuple[int, int] | None = None
    xpu: tuple[int, int] | None = None
    notes: tuple[str, ...] = field(default=())
    """How each fact was found, for `kerneld --check-config` and logs."""

    def has(self, vendor: str) -> bool:
        return any(g.vendor == vendor for g in self.gpus)

    def capabilities(self, vendor: str) -> tuple[str, ...]:
        return tuple(
            dict.fromkeys(g.capability for g in self.gpus if g.vendor == vendor and g.capability)
        )

    def backends(self) -> list[Backend]:
        """CPU, then one backend per GPU vendor (version None where the host cannot tell)."""
        out = [Backend(BackendType.CPU)]
        if self.has("nvidia"):
            out.append(Backend(BackendType.CUDA, self.cuda_driver))
        if self.has("amd"):
            out.append(Backend(BackendType.ROCM, self.rocm))
        if self.has("intel"):
            out.append(Backend(BackendType.XPU, self.xpu))
        return out

    def platforms(self, torch_versions: Sequence[tuple[int, int]] = ()) -> list[PlatformFacts]:
        """Facts of a process that would use each backend here, per torch version (or none)."""
        caps = {"cuda": self.capabilities("nvidia"), "rocm": self.capabilities("amd")}
        out: list[PlatformFacts] = []
        for backend in self.backends():
            versions: list[tuple[int, int] | None] = list(torch_versions) or [None]
            for torch in versions:
                out.append(
                    PlatformFacts(
                        cpu=self.cpu,
                        os=self.os,
                        torch_version=torch,
                        cxx11_abi=True if torch is not None and self.os == "linux" else None,
                        backend=backend,
                        device_capabilities=caps.get(backend.type.value, ()),
                    )
                )
        return out

    def summary(self) -> str:
        """One log line: `cpu=x86_64 nvidia=2x9.0 cuda_driver=12.8 ...`."""
        bits = [f"cpu={self.cpu}", f"os={self.os}"]
        for vendor in ("nvidia", "amd", "intel"):
            gpus = [g for g in self.gpus if g.vendor == vendor]
            if gpus:
                caps = ",".join(sorted({g.capability or "?" for g in gpus}))
                bits.append(f"{vendor}={len(gpus)}x{caps}")
        if self.nvidia_driver:
            bits.append(f"nvidia_driver={self.nvidia_driver}")
        for name, version in (("cuda_driver", self.cuda_driver), ("rocm", self.rocm)):
            if version is not None:
                bits.append(f"{name}={version[0]}.{version[1]}")
        return " ".join(bits)


def cuda_for_driver(driver: str) -> tuple[int, int] | None:
    """The newest CUDA version a driver (`570.86.15`) runs, from the release-notes table."""
    try:
        have = tuple(int(p) for p in driver.strip().split("."))
    except ValueError:
        return None
    for cuda, minimum in CUDA_DRIVER_MINIMUM:
        if have >= minimum:
            return cuda
    return None


def nvidia_capability(model: str) -> str:
    for pattern, cap in _NVIDIA_MODELS:
        if re.search(pattern, model, re.IGNORECASE):
            return cap
    return ""


def gfx_name(target_version: int) -> str:
    """KFD `gfx_target_version` (major*10000 + minor*100 + stepping) -> `gfx942`, `gfx90a`."""
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return rocm_target(major, minor, stepping)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _hex_file(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def _version2(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    m = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


# ---- NVIDIA ------------------------------------------------------------------------------------


def _nvml() -> tuple[list[Gpu], str | None, tuple[int, int] | None] | None:
    """Devices, driver version and CUDA version from NVML; None when NVML is not usable."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        cuda_int = int(nvml.nvmlSystemGetCudaDriverVersion())
        cuda = (cuda_int // 1000, (cuda_int % 1000) // 10)
        gpus = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            bus = nvml.nvmlDeviceGetPciInfo(handle).busId
            bus = bus.decode() if isinstance(bus, bytes) else str(bus)
            gpus.append(Gpu("nvidia", name, cuda_capability(major, minor), bus))
        return gpus, driver, cuda
    except Exception as exc:
        log.warning("NVML query failed, falling back to /proc: %s", exc)
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown: %s", exc)


def _pci_display_devices(root: Path, vendor: int) -> list[tuple[str, int | None]]:
    """(PCI address, device id) of display controllers (class 0x03xxxx) from `vendor`."""
    base = root / "sys/bus/pci/devices"
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    out = []
    for dev in entries:
        if _hex_file(dev / "vendor") != vendor:
            continue
        cls = _hex_file(dev / "class")
        if cls is None or cls >> 16 != 0x03:
            continue
        out.append((dev.name, _hex_file(dev / "device")))
    return out


def _nvidia_procfs(root: Path) -> tuple[list[Gpu], str | None, list[str]]:
    notes: list[str] = []
    driver = None
    text = _read(root / "proc/driver/nvidia/version")
    if text:
        m = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
        if m:
            driver = m.group(1)
            notes.append("nvidia driver from proc/driver/nvidia/version")
    if driver is None:
        module = _read(root / "sys/module/nvidia/version")
        if module and re.fullmatch(r"\d+\.\d+(?:\.\d+)?", module.strip()):
            driver = module.strip()
            notes.append("nvidia driver from sys/module/nvidia/version")
    gpus: list[Gpu] = []
    gpu_dir = root / "proc/driver/nvidia/gpus"
    try:
        infos = sorted(gpu_dir.iterdir())
    except OSError:
        infos = []
    for info_dir in infos:
        info = _read(info_dir / "information") or ""
        m = re.search(r"^Model:\s*(.+?)\s*$", info, re.MULTILINE)
        name = m.group(1) if m else "NVIDIA GPU"
        gpus.append(Gpu("nvidia", name, nvidia_capability(name), info_dir.name))
    if gpus:
        notes.append("nvidia devices from proc/driver/nvidia/gpus")
    else:
        for address, device in _pci_display_devices(root, NVIDIA_VENDOR):
            name = f"NVIDIA PCI device {device:#06x}" if device is not None else "NVIDIA GPU"
            gpus.append(Gpu("nvidia", name, "", address))
        if gpus:
            notes.append("nvidia devices from sys/bus/pci (no driver information)")
    return gpus, driver, notes


# ---- AMD and Intel -----------------------------------------------------------------------------


def _amd(root: Path) -> list[Gpu]:
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    try:
        entries = sorted(nodes.iterdir(), key=lambda p: (len(p.name), p.name))
    except OSError:
        return []
    gpus = []
    for node in entries:
        props = _read(node / "properties") or ""
        m = re.search(r"^gfx_target_version\s+(\d+)\s*$", props, re.MULTILINE)
        if not m or int(m.group(1)) == 0:  # CPU nodes report 0
            continue
        gfx = gfx_name(int(m.group(1)))
        name = (_read(node / "name") or "").strip() or f"AMD {gfx}"
        gpus.append(Gpu("amd", name, gfx, f"kfd node {node.name}"))
    return gpus


def _intel(root: Path) -> list[Gpu]:
    drm = root / "sys/class/drm"
    try:
        cards = sorted(p for p in drm.iterdir() if re.fullmatch(r"card\d+", p.name))
    except OSError:
        return []
    gpus = []
    for card in cards:
        if _hex_file(card / "device/vendor") != INTEL_VENDOR:
            continue
        device = _hex_file(card / "device/device")
        name = f"Intel GPU {device:#06x}" if device is not None else "Intel GPU"
        gpus.append(Gpu("intel", name, "", card.name))
    return gpus


# ---- entry point -------------------------------------------------------------------------------


def detect(
    root: Path | str = "/", *, machine: str | None = None, use_nvml: bool | None = None
) -> Hardware:
    """Read the host's hardware under `root`. Never raises: unknown facts stay None."""
    root = Path(root)
    notes: list[str] = []
    gpus: list[Gpu] = []
    driver: str | None = None
    cuda: tuple[int, int] | None = None
    nvml = _nvml() if (use_nvml if use_nvml is not None else root == Path("/")) else None
    if nvml is not None and nvml[0]:
        gpus, driver, cuda = nvml[0], nvml[1], nvml[2]
        notes.append("nvidia via NVML")
    else:
        gpus, driver, more = _nvidia_procfs(root)
        notes += more
        cuda = cuda_for_driver(driver) if driver else None
        if gpus and driver is None:
            notes.append("NVIDIA GPU without a loaded driver: no CUDA variants")
    amd = _amd(root)
    rocm = None
    if amd:
        rocm = _version2(_read(root / "opt/rocm/.info/version"))
        notes.append(
            f"ROCm {rocm[0]}.{rocm[1]} from opt/rocm/.info/version"
            if rocm
            else "ROCm version unknown: ROCm arch variants only for client platforms"
        )
    intel = _intel(root)
    if intel:
        notes.append("XPU version unknown: XPU arch variants only for client platforms")
    os_name = platform.system().lower()
    hw = Hardware(
        cpu=normalise_machine(machine if machine is not None else platform.machine(), os_name),
        os=os_name,
        gpus=tuple(gpus + amd + intel),
        nvidia_driver=driver,
        cuda_driver=cuda,
        rocm=rocm,
        xpu=None,
        notes=tuple(notes),
    )
    log.info("hardware: %s", hw.summary())
    return hw
