"""What variant choice knows about a process: `PlatformFacts`, plain values, no torch needed.

The daemon holds the facts of the processes that ask it (sent over the RPC or written to the
environment as JSON), so it can rank variants for a torch it never imports.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kerneld_client.variants.names import (
    NOARCH_NAMES,
    VERSION_PREFIX,
    Backend,
    BackendType,
    parse_backend,
)
from kerneld_client.variants.versions import dotted, parse_version

_FACT_KEYS = {
    "torch_version",
    "cxx11_abi",
    "backend",
    "cpu",
    "os",
    "free_threaded",
    "python_version",
    "macos_version",
    "tvm_ffi_version",
    "device_capabilities",
    "mlx",
}


def _two_part(text: str | None) -> tuple[int, int] | None:
    v = parse_version(text, parts=2)
    return None if v is None else (v[0], v[1])


def _backend_from_obj(obj: Any) -> tuple[Backend, bool]:
    if isinstance(obj, str):
        if obj in NOARCH_NAMES:
            return Backend(BackendType(obj)), False
        return parse_backend(obj), False
    if not isinstance(obj, Mapping):
        raise ValueError(f"backend must be a token or an object, got {obj!r}")
    unknown = set(obj) - {"type", "version", "explicit"}
    if unknown:
        raise ValueError(f"unknown backend keys: {sorted(unknown)}")
    try:
        btype = BackendType(str(obj.get("type") or "cpu").lower())
    except ValueError:
        raise ValueError(f"unknown backend type {obj.get('type')!r}") from None
    version = _two_part(obj.get("version")) if btype in VERSION_PREFIX else None
    return Backend(btype, version), bool(obj.get("explicit", False))


def _is_unicode(text: str) -> bool:
    """No lone surrogates (from `\\ud800` in JSON, or undecodable bytes in the environment):
    such facts could not even be sent to the daemon (protobuf strings are UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _this_python() -> tuple[int, int, int]:
    return (sys.version_info[0], sys.version_info[1], sys.version_info[2])


@dataclass(frozen=True, kw_only=True)
class PlatformFacts:
    """Everything variant choice depends on, as plain values (no torch needed to hold them).

    `backend` is the backend variants are chosen for: the detected one, or CPU when the caller
    asked for `backend="cpu"` (`backend_explicit`). `free_threaded` is the interpreter's build
    flag (`Py_GIL_DISABLED`), which is what decides abi3 support, not whether the GIL is on now.
    """

    cpu: str
    os: str
    torch_version: tuple[int, int] | None = None
    cxx11_abi: bool | None = None
    backend: Backend = field(default_factory=lambda: Backend(BackendType.CPU))
    backend_explicit: bool = False
    free_threaded: bool = False
    python_version: tuple[int, int, int] = field(default_factory=_this_python)
    macos_version: tuple[int, ...] | None = None
    tvm_ffi_version: tuple[int, int] | None = None
    device_capabilities: tuple[str, ...] = ()
    #: Whether MLX is installed (`mlx-<backend>` noarch variants need it, as in `kernels` 0.19).
    mlx: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_capabilities", tuple(self.device_capabilities))
        for name in ("torch_version", "tvm_ffi_version"):
            value = getattr(self, name)
            if value is not None and len(value) != 2:
                raise ValueError(f"{name} must be (major, minor), got {value!r}")
        if len(self.python_version) != 3:
            raise ValueError(f"python_version must be (major, minor, micro): {self.python_version}")

    def with_backend(self, requested: str | None) -> PlatformFacts:
        """Facts for an explicit `backend=` request, with the rules of `kernels`.

        Only `cpu` or the detected backend's own name are allowed; anything else is a ValueError.
        """
        if requested is None:
            return self
        if requested == BackendType.CPU.value:
            return replace(
                self,
                backend=Backend(BackendType.CPU),
                backend_explicit=True,
                device_capabilities=(),
            )
        if requested == self.backend.type.value:
            return replace(self, backend_explicit=True)
        supported = ", ".join(sorted({BackendType.CPU.value, self.backend.type.value}))
        raise ValueError(f"Invalid backend {requested!r}, system supported backends: {supported}")

    def describe(self) -> str:
        """One line for error messages: `torch 2.13 cxx11, CUDA 13.0, x86_64-linux, ...`."""
        torch = f"torch {dotted(self.torch_version)}" if self.torch_version else "no torch"
        if self.cxx11_abi is not None and self.torch_version:
            torch += " cxx11" if self.cxx11_abi else " cxx98"
        bits = [torch, self.backend.label + (" (requested)" if self.backend_explicit else "")]
        bits.append(f"{self.cpu}-{self.os}")
        py = f"Python {dotted(self.python_version)}"
        bits.append(py + (" free-threaded" if self.free_threaded else ""))
        if self.macos_version:
            bits.append(f"macOS {dotted(self.macos_version)}")
        if self.tvm_ffi_version:
            bits.append(f"tvm-ffi {dotted(self.tvm_ffi_version)}")
        if self.mlx:
            bits.append("MLX")
        if self.device_capabilities:
            bits.append("devices " + ",".join(self.device_capabilities))
        return ", ".join(bits)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; the same field names and spellings as `kerneld.v1.PlatformFacts`."""
        return {
            "torch_version": dotted(self.torch_version),
            "cxx11_abi": self.cxx11_abi,
            "backend": {
                "type": self.backend.type.value,
                "version": dotted(self.backend.version),
                "explicit": self.backend_explicit,
            },
            "cpu": self.cpu,
            "os": self.os,
            "free_threaded": self.free_threaded,
            "python_version": dotted(self.python_version),
            "macos_version": dotted(self.macos_version),
            "tvm_ffi_version": dotted(self.tvm_ffi_version),
            "device_capabilities": list(self.device_capabilities),
            "mlx": self.mlx,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlatformFacts:
        """Inverse of `to_dict`; ValueError names the bad key (input may come from a client).

        `backend` may also be a variant token (`"cu130"`, `"cpu"`). Missing keys take the
        dataclass defaults; `cpu` and `os` are required (as strings).
        """
        unknown = set(data) - _FACT_KEYS
        if unknown:
            raise ValueError(f"unknown platform fact keys: {sorted(unknown)}")
        # Empty cpu/os is allowed (platform.machine() can be ""): it only matches noarch.
        for key in ("cpu", "os"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"platform fact {key!r} must be a string")
            if not data[key].isascii() and not _is_unicode(data[key]):
                raise ValueError(f"platform fact {key!r} is not valid Unicode: {data[key]!r}")
        try:
            kwargs: dict[str, Any] = {"cpu": data["cpu"], "os": data["os"]}
            if "torch_version" in data:
                kwargs["torch_version"] = _two_part(data["torch_version"])
            if "tvm_ffi_version" in data:
                kwargs["tvm_ffi_version"] = _two_part(data["tvm_ffi_version"])
            if "cxx11_abi" in data:
                abi = data["cxx11_abi"]
                if abi is not None and not isinstance(abi, bool):
                    raise ValueError(f"cxx11_abi must be true, false or null, got {abi!r}")
                kwargs["cxx11_abi"] = abi
            if "backend" in data:
                kwargs["backend"], kwargs["backend_explicit"] = _backend_from_obj(data["backend"])
            if "free_threaded" in data:
                if not isinstance(data["free_threaded"], bool):
                    raise ValueError("free_threaded must be true or false")
                kwargs["free_threaded"] = data["free_threaded"]
            py = parse_version(str(data.get("python_version") or ""), parts=3)
            if py is not None:  # empty or blank: this interpreter's version (the default)
                kwargs["python_version"] = (py[0], py[1], py[2])
            if "mlx" in data:
                if not isinstance(data["mlx"], bool):
                    raise ValueError("mlx must be true or false")
                kwargs["mlx"] = data["mlx"]
            if "macos_version" in data:
                kwargs["macos_version"] = parse_version(data["macos_version"] or None)
            caps = data.get("device_capabilities") or ()
            if isinstance(caps, str) or not all(isinstance(c, str) for c in caps):
                raise ValueError("device_capabilities must be a list of strings")
            if not all(_is_unicode(c) for c in caps):
                raise ValueError(f"device_capabilities are not valid Unicode: {caps!r}")
            kwargs["device_capabilities"] = tuple(caps)
            return cls(**kwargs)
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"bad platform facts: {exc}") from exc
