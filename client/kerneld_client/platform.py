"""Facts about *this* process (torch, backend, ABI, CPU, OS, devices), computed once.

Variant choice must see the same facts `kernels` would see, so detection follows its rules
(REFERENCE.md section 2): the backend is the first of TPU, Neuron, CUDA, ROCm, MPS, XPU, NPU, CPU
that torch reports, and the CUDA version is torch's build version, not the driver's.

Importing this module imports nothing heavy; torch is imported on the first `current_platform()`
call, and only torch (device capabilities are read through it). Detection produces the facts in
`PlatformFacts.to_dict()` form and their fingerprint (`Platform`); the variant rules, whose
`PlatformFacts` the load paths that rank variants need, are imported only when one does: a warm
load looks its fingerprint up in the daemon's published picks instead. Without a GPU, or to pin the
facts, set `KERNELD_PLATFORM_JSON` to a JSON object in the form of `PlatformFacts.to_dict()`,
for example::

    KERNELD_PLATFORM_JSON='{"torch_version": "2.13", "cxx11_abi": true, "backend": "cu130",
                            "device_capabilities": ["9.0"]}'

Missing keys take this interpreter's CPU, OS, Python version and free-threading flag, and
otherwise "absent" (no torch, CPU backend, no tvm-ffi, no devices). `backend` is a variant token
(`"cu130"`, `"rocm64"`, `"cpu"`) or `{"type": "cuda", "version": "13.0", "explicit": false}`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import platform as _stdlib_platform
import sys
import threading
from typing import TYPE_CHECKING, Any

from kerneld_client import _config
from kerneld_client.device_names import cuda_capability, normalise_machine
from kerneld_client.variants.fingerprints import fingerprint
from kerneld_client.variants.versions import dotted, parse_version

if TYPE_CHECKING:
    from kerneld_client.variants import PlatformFacts

__all__ = [
    "ENV_VAR",
    "Platform",
    "current_platform",
    "detect_platform_facts",
    "facts_from_json",
    "platform_facts",
    "reset_platform_facts",
    "set_platform_facts",
]

log = logging.getLogger(__name__)

#: Environment variable holding a JSON facts object that replaces detection.
ENV_VAR = _config.ENV_PLATFORM_JSON
# Distribution names that ship the `tvm_ffi` module.
_TVM_FFI_DISTRIBUTIONS = ("apache-tvm-ffi", "tvm-ffi", "tvm_ffi")

_lock = threading.Lock()
_cached: Platform | None = None
_override: Platform | None = None


class _Detect:
    """Sentinel: find torch the normal way."""


_DETECT = _Detect()


class Platform:
    """A process's facts in `PlatformFacts.to_dict()` form (`raw`) and their fingerprint
    (`key`); `facts`, the `PlatformFacts` the variant rules take, is built on first use."""

    __slots__ = ("_facts", "key", "raw")

    def __init__(self, raw: dict[str, Any], facts: PlatformFacts | None = None) -> None:
        self.raw = raw
        self.key = fingerprint(raw)
        self._facts = facts

    @classmethod
    def of(cls, facts: PlatformFacts) -> Platform:
        return cls(facts.to_dict(), facts)

    @property
    def facts(self) -> PlatformFacts:
        if self._facts is None:
            from kerneld_client.variants.facts import PlatformFacts

            self._facts = PlatformFacts.from_dict(self.raw)
        return self._facts

    @property
    def backend_type(self) -> str:
        """The backend variants are chosen for (`cuda`, `rocm`, `cpu`, ...)."""
        return str(self.raw["backend"]["type"])

    @property
    def device_capabilities(self) -> tuple[str, ...]:
        """The devices' CUDA capabilities (`9.0`) or ROCm targets (`gfx942`); may be empty."""
        return tuple(self.raw.get("device_capabilities") or ())

    def with_backend(self, requested: str | None) -> Platform:
        """The platform for an explicit `backend=` request (`PlatformFacts.with_backend`)."""
        return self if requested is None else Platform.of(self.facts.with_backend(requested))


def current_platform(backend: str | None = None, *, refresh: bool = False) -> Platform:
    """This process's platform, detected once and cached (torch cannot change under a process).

    `backend="cpu"` asks for CPU variants on a GPU machine, as `get_kernel(backend=...)` does in
    `kernels`; any other name must be the detected backend's (ValueError otherwise).
    Precedence: `set_platform_facts()`, then `KERNELD_PLATFORM_JSON`, then detection.
    """
    global _cached
    base = _override
    if base is None:
        with _lock:
            if _cached is None or refresh:
                env = _config.raw(ENV_VAR)
                _cached = Platform.of(facts_from_json(env)) if env else Platform(detect_raw())
            base = _cached
    return base.with_backend(backend)


def platform_facts(backend: str | None = None, *, refresh: bool = False) -> PlatformFacts:
    """This process's `PlatformFacts` (see `current_platform`)."""
    return current_platform(backend, refresh=refresh).facts


def set_platform_facts(facts: PlatformFacts | None) -> None:
    """Pin the facts `platform_facts()` returns (tests, embedding); None removes the pin."""
    global _override
    _override = None if facts is None else Platform.of(facts)


def reset_platform_facts() -> None:
    """Forget the cached detection, so the next call detects (or reads the env var) again."""
    global _cached
    with _lock:
        _cached = None


def _free_threaded_build() -> bool:
    """Whether this interpreter was built free-threaded (PEP 703).

    POSIX builds say so in `sys.abiflags` ("t"); reading it is free, while `sysconfig` costs
    0.4 ms to import and its first `get_config_var` imports the build's sysconfigdata (~1-3 ms).
    """
    abiflags = getattr(sys, "abiflags", None)
    if abiflags is not None:
        return "t" in abiflags
    import sysconfig  # Windows: no abiflags

    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def _interpreter_facts() -> dict[str, Any]:
    """The facts the standard library knows; cheap, so also the defaults of the env var."""
    os_name = _stdlib_platform.system().lower()
    mac = _stdlib_platform.mac_ver()[0] if os_name == "darwin" else ""
    return {
        "cpu": normalise_machine(_stdlib_platform.machine(), os_name),
        "os": os_name,
        "python_version": ".".join(str(p) for p in sys.version_info[:3]),
        # The build flag decides abi3 support, whether or not the GIL was re-enabled at run time.
        "free_threaded": _free_threaded_build(),
        "macos_version": mac,
    }


def facts_from_json(text: str) -> PlatformFacts:
    """Parse a `KERNELD_PLATFORM_JSON` value; ValueError (naming the variable) when invalid."""
    from kerneld_client.variants.facts import PlatformFacts

    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        merged = _interpreter_facts()
        merged.update(data)
        return PlatformFacts.from_dict(merged)
    except ValueError as exc:
        raise ValueError(f"{ENV_VAR} is not a valid platform facts object: {exc}") from exc
    except RecursionError:
        raise ValueError(
            f"{ENV_VAR} is not a valid platform facts object: nested too deeply"
        ) from None


def _tvm_ffi_version() -> str:
    """Installed tvm-ffi version from package metadata, without importing tvm_ffi."""
    try:
        if importlib.util.find_spec("tvm_ffi") is None:
            return ""
    except (ImportError, ValueError):
        return ""
    from importlib import metadata  # only when tvm_ffi is installed: it costs tens of ms

    for dist in _TVM_FFI_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _has_mlx() -> bool:
    """Whether MLX is installed (`kernels` 0.19 asks `find_spec("mlx")`), without importing it."""
    try:
        return importlib.util.find_spec("mlx") is not None
    except (ImportError, ValueError):
        return False


def _mlx_metal_backend() -> dict[str, Any] | None:
    """Without torch, `kernels` 0.19 picks Metal when MLX is installed and sees a Metal device."""
    try:
        import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]

        return _backend("metal") if mx.metal.is_available() else None
    except Exception as exc:  # a broken MLX must not break the job: noarch CPU facts
        log.debug("MLX is installed but its Metal check failed: %s", exc)
        return None


def _import_torch() -> Any | None:
    """torch, or None when it is not installed or fails to import (noarch variants only)."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        return importlib.import_module("torch")
    except Exception as exc:  # a broken torch must not break the job; we fall back to noarch
        log.warning("torch is installed but failed to import (%s); using noarch facts", exc)
        return None


def _two(text: str) -> tuple[int, int] | None:
    try:
        v = parse_version(text, parts=2)
    except ValueError:
        return None
    return None if v is None else (v[0], v[1])


def _backend(kind: str, version: tuple[int, int] | None = None) -> dict[str, Any]:
    """A backend in `PlatformFacts.to_dict()` form."""
    return {"type": kind, "version": dotted(version), "explicit": False}


def _cann_version() -> tuple[int, int] | None:
    # torch_npu registered the `npu` backend, so it is already imported; this reads its module.
    try:
        collect_env = importlib.import_module("torch_npu.utils.collect_env")
        return _two(str(collect_env.get_cann_version()))
    except Exception:
        return None


def _torch_backend(torch: Any) -> dict[str, Any]:
    """The backend torch was built for, first match in the order `kernels` uses."""
    backends = getattr(torch, "backends", None)
    version = getattr(torch, "version", None)
    if hasattr(backends, "tpu"):
        return _backend("tpu")
    if hasattr(torch, "neuron"):  # before CUDA: the Neuron extension loads into CUDA builds too
        return _backend("neuron")
    cuda = getattr(version, "cuda", None)
    if cuda is not None:
        return _backend("cuda", _two(str(cuda)))
    hip = getattr(version, "hip", None)
    if hip is not None:
        return _backend("rocm", _two(str(hip).split("-")[0]))
    mps = getattr(backends, "mps", None)
    if mps is not None and mps.is_available():
        return _backend("metal")
    xpu = getattr(version, "xpu", None)
    if xpu is not None:
        # `kernels` reads year = chars 0-3 and release = char 5 of e.g. "20250301".
        text = str(xpu)
        year, release = text[0:4], text[5:6]
        ok = year.isascii() and year.isdigit() and release.isascii() and release.isdigit()
        return _backend("xpu", (int(year), int(release)) if ok else None)
    try:
        privateuse = torch._C._get_privateuse1_backend_name()
    except Exception:
        privateuse = None
    if privateuse == "npu":
        return _backend("cann", _cann_version())
    return _backend("cpu")


def _cudart_backend() -> dict[str, Any] | None:
    """Without torch, `kernels` asks libcudart for the CUDA runtime version (noarch choice)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("cudart")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        out = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(out)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    value = out.value  # major * 1000 + minor * 10
    return _backend("cuda", (value // 1000, (value % 1000) // 10))


def _device_capabilities(torch: Any, backend: str) -> list[str]:
    """The current device's CUDA capability (`9.0`) or ROCm gfx target (`gfx942`), as checked
    by `kernels` before import; empty when there is no usable device."""
    if backend not in ("cuda", "rocm"):
        return []
    try:
        cuda = torch.cuda
        if not cuda.is_available():
            return []
        index = cuda.current_device()
        if backend == "cuda":
            major, minor = cuda.get_device_capability(index)
            return [cuda_capability(major, minor)]
        arch = str(cuda.get_device_properties(index).gcnArchName)
        return [arch.split(":", maxsplit=1)[0]]
    except Exception as exc:
        log.debug("could not read the device capability: %s", exc)
        return []


def detect_raw(*, torch_module: Any = _DETECT, probe_devices: bool = True) -> dict[str, Any]:
    """Detect the facts now, uncached, in `PlatformFacts.to_dict()` form (every version cut
    to the parts variant choice compares, so the fingerprint is the one the daemon computes
    from the same facts sent over the RPC).

    `torch_module` injects a torch-like object (tests without a GPU) or None for "no torch";
    `probe_devices=False` skips reading device capabilities (which initialises CUDA).
    """
    data = _interpreter_facts()
    data["macos_version"] = dotted(_version_or_none(data["macos_version"]))
    data["tvm_ffi_version"] = dotted(_two(_tvm_ffi_version()))
    data["mlx"] = _has_mlx()
    torch = _import_torch() if isinstance(torch_module, _Detect) else torch_module
    if torch is None:
        data.update(torch_version="", cxx11_abi=None, device_capabilities=[])
        backend = _cudart_backend()  # in `kernels`' order: CUDA, then MLX's Metal, then CPU
        if backend is None and data["mlx"]:
            backend = _mlx_metal_backend()
        data["backend"] = backend or _backend("cpu")
        return data
    backend = _torch_backend(torch)
    data["torch_version"] = dotted(_two(str(getattr(torch, "__version__", ""))))
    data["cxx11_abi"] = bool(torch.compiled_with_cxx11_abi()) if data["os"] == "linux" else None
    data["backend"] = backend
    caps = _device_capabilities(torch, backend["type"]) if probe_devices else []
    data["device_capabilities"] = caps
    return data


def _version_or_none(text: str) -> tuple[int, ...] | None:
    try:
        return parse_version(text)
    except ValueError:
        return None


def detect_platform_facts(
    *, torch_module: Any = _DETECT, probe_devices: bool = True
) -> PlatformFacts:
    """`detect_raw` as `PlatformFacts`."""
    from kerneld_client.variants.facts import PlatformFacts

    return PlatformFacts.from_dict(
        detect_raw(torch_module=torch_module, probe_devices=probe_devices)
    )
