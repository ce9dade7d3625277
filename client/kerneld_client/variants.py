"""Build-variant names, acceptance and preference: one source of truth for client and daemon.

The client and the daemon must agree on which folder under `build/` a process can load, or the
fast path and the RPC path would pick different kernels. Both call `decide()` with explicit
`PlatformFacts`, so the daemon can rank variants for a process whose torch it never imports.

The rules are those of the `kernels` package 0.17.2 (see REFERENCE.md section 2); where that page
and the package differ, the package wins, so kerneld chooses the same variant `kernels` would.
Nothing here imports torch, protobuf or grpc: the protobuf conversion lives in `_convert`.
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "UNRECOGNISED",
    "Abi",
    "Backend",
    "BackendType",
    "Decision",
    "PlatformFacts",
    "UnrecognisedVariant",
    "Variant",
    "VariantKind",
    "arch_compatible",
    "best_variant",
    "decide",
    "device_compatible",
    "parse_backend",
    "parse_variant",
    "parse_version",
    "summarize",
]

#: The rejection reason of a folder name that is not a build variant at all.
UNRECOGNISED = "unrecognised variant name"
#: Free-threaded CPython before this version cannot load abi3 extensions (arch variants).
FREE_THREADED_ABI3_MIN_PYTHON = (3, 15)
#: Metal kernels are built with `-std=metal4.0`, which needs this macOS major version.
METAL_MIN_MACOS = 26


class VariantKind(str, enum.Enum):
    """What a build variant was built against; decides which facts it is checked against."""

    TORCH_ARCH = "torch-arch"
    STABLE_ABI = "stable-abi"
    TVM_FFI = "tvm-ffi"
    NOARCH = "noarch"
    UNIVERSAL = "universal"


class Abi(str, enum.Enum):
    """The C++ ABI tag of a torch-arch variant (`none`: untagged)."""

    CXX11 = "cxx11"
    CXX98 = "cxx98"
    NONE = "none"


class BackendType(str, enum.Enum):
    """Hardware backends named in variant names and in `metadata.json`."""

    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    XPU = "xpu"
    CANN = "cann"
    METAL = "metal"
    NEURON = "neuron"
    TPU = "tpu"
    # Only a noarch name (`torch-npu`): the noarch spelling of a CANN machine.
    NPU = "npu"


# Backends whose variant token carries a version, and the token's prefix.
_VERSION_PREFIX: dict[BackendType, str] = {
    BackendType.CUDA: "cu",
    BackendType.ROCM: "rocm",
    BackendType.XPU: "xpu",
    BackendType.CANN: "cann",
}
_LABEL: dict[BackendType, str] = {
    BackendType.CPU: "CPU",
    BackendType.CUDA: "CUDA",
    BackendType.ROCM: "ROCm",
    BackendType.XPU: "XPU",
    BackendType.CANN: "CANN",
    BackendType.METAL: "Metal",
    BackendType.NEURON: "Neuron",
    BackendType.TPU: "TPU",
    BackendType.NPU: "NPU",
}
# Unversioned backend tokens allowed in arch variant names (`npu` is noarch-only).
_PLAIN_ARCH_TOKENS = {"cpu", "metal", "neuron", "tpu"}
# Recognised `torch-<name>` noarch names (`torch-cann` parses but never matches, as in `kernels`:
# a CANN machine loads `torch-npu`).
_NOARCH_NAMES = {t.value for t in BackendType}


def _fmt(version: tuple[int, ...] | None) -> str:
    return "" if version is None else ".".join(str(p) for p in version)


@dataclass(frozen=True)
class Backend:
    """A backend and, for CUDA/ROCm/XPU/CANN, its major.minor toolkit version."""

    type: BackendType
    version: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", BackendType(self.type))
        if self.version is not None:
            if self.type not in _VERSION_PREFIX:
                raise ValueError(f"backend {self.type.value} has no version")
            if len(self.version) != 2 or not all(
                isinstance(p, int) and p >= 0 for p in self.version
            ):
                raise ValueError(f"backend version must be (major, minor), got {self.version!r}")

    @property
    def token(self) -> str:
        """The variant-name spelling: `cu130`, `rocm64`, `cpu` (`cuda` when unversioned)."""
        prefix = _VERSION_PREFIX.get(self.type)
        if prefix is None or self.version is None:
            return self.type.value
        return f"{prefix}{self.version[0]}{self.version[1]}"

    @property
    def noarch_name(self) -> str:
        """The `torch-<name>` noarch variant this backend loads (CANN loads `torch-npu`)."""
        return BackendType.NPU.value if self.type is BackendType.CANN else self.type.value

    @property
    def label(self) -> str:
        """Human spelling for messages: `CUDA 13.0`, `CPU`."""
        name = _LABEL[self.type]
        if self.type in _VERSION_PREFIX:
            return f"{name} {_fmt(self.version)}" if self.version else f"{name} (version unknown)"
        return name


@dataclass(frozen=True)
class Variant:
    """A parsed build-variant folder name.

    `torch_version` is the torch version of a torch-arch variant and the ABI version of a
    stable-ABI variant; `backend` is None only for `torch-universal`.
    """

    name: str
    kind: VariantKind
    backend: Backend | None
    torch_version: tuple[int, int] | None = None
    tvm_ffi_version: tuple[int, int] | None = None
    abi: Abi = Abi.NONE
    cpu: str | None = None
    os: str | None = None

    @property
    def is_arch(self) -> bool:
        """Arch variants hold a native extension; noarch ones are pure Python."""
        return self.kind in (VariantKind.TORCH_ARCH, VariantKind.STABLE_ABI, VariantKind.TVM_FFI)

    @property
    def canonical_name(self) -> str:
        """The name `kernels` writes for this variant (it normalises `torch2013` to `torch213`)."""
        if self.kind is VariantKind.UNIVERSAL:
            return "torch-universal"
        assert self.backend is not None
        if self.kind is VariantKind.NOARCH:
            return f"torch-{self.backend.type.value}"
        if self.kind is VariantKind.TORCH_ARCH:
            assert self.torch_version is not None
            framework = f"torch{self.torch_version[0]}{self.torch_version[1]}"
            if self.abi is not Abi.NONE:
                framework += f"-{self.abi.value}"
        elif self.kind is VariantKind.STABLE_ABI:
            assert self.torch_version is not None
            framework = f"torch-stable-abi{self.torch_version[0]}{self.torch_version[1]}"
        else:
            assert self.tvm_ffi_version is not None
            framework = f"tvm-ffi{self.tvm_ffi_version[0]}{self.tvm_ffi_version[1]}"
        return f"{framework}-{self.backend.token}-{self.cpu}-{self.os}"


@dataclass(frozen=True)
class UnrecognisedVariant:
    """A folder name that is not a build variant; reported, never raised."""

    name: str
    detail: str

    @property
    def reason(self) -> str:
        """The rejection reason shown to users."""
        return UNRECOGNISED


# ASCII digits only: `kernels` matches `\d` but then fails on non-ASCII digits in `Version`.
_TORCH_RE = re.compile(r"torch([0-9])([0-9]+)")
_STABLE_RE = re.compile(r"torch-stable-abi([0-9])([0-9]+)")
_TVM_FFI_RE = re.compile(r"ffi([0-9])([0-9]+)")
# Greedy major: the minor is the last digit only (`cu1210` is 121.0, as in `kernels`).
_VERSIONED_RE = re.compile(r"(cu|rocm|xpu|cann)([0-9]+)([0-9])")
_PREFIX_TYPE = {prefix: t for t, prefix in _VERSION_PREFIX.items()}


def _two(major: str, minor: str) -> tuple[int, int]:
    # int() refuses > 4300 digits with ValueError; callers turn that into "unrecognised".
    return int(major), int(minor)


def parse_backend(token: str) -> Backend:
    """Parse an arch-variant backend token (`cu128`, `rocm64`, `xpu20253`, `cpu`); ValueError."""
    if token in _PLAIN_ARCH_TOKENS:
        return Backend(BackendType(token))
    m = _VERSIONED_RE.fullmatch(token)
    if m is None:
        raise ValueError(f"unknown backend token {token!r}")
    return Backend(_PREFIX_TYPE[m.group(1)], _two(m.group(2), m.group(3)))


def _parse_arch(name: str, parts: list[str]) -> tuple[Backend, str, str]:
    if len(parts) != 3:
        raise ValueError(f"expected <backend>-<cpu>-<os> after the framework in {name!r}")
    return parse_backend(parts[0]), parts[1], parts[2]


def _parse(name: str) -> Variant:
    parts = name.split("-")
    if name.startswith("torch-stable-abi"):
        m = _STABLE_RE.fullmatch("-".join(parts[:3]))
        if m is None:
            raise ValueError("malformed stable-ABI version")
        backend, cpu, os_ = _parse_arch(name, parts[3:])
        return Variant(
            name,
            VariantKind.STABLE_ABI,
            backend,
            torch_version=_two(m.group(1), m.group(2)),
            cpu=cpu,
            os=os_,
        )
    if parts[0] == "torch":
        rest = "-".join(parts[1:])
        if rest == "universal":
            return Variant(name, VariantKind.UNIVERSAL, None)
        if rest in _NOARCH_NAMES:
            return Variant(name, VariantKind.NOARCH, Backend(BackendType(rest)))
        raise ValueError(f"unknown noarch backend {rest!r}")
    if parts[0].startswith("torch"):
        abi = Abi.NONE
        arch_parts = parts[1:]
        if len(parts) >= 2 and parts[1] in ("cxx11", "cxx98"):
            abi = Abi(parts[1])
            arch_parts = parts[2:]
        m = _TORCH_RE.fullmatch(parts[0])
        if m is None:
            raise ValueError("malformed torch version")
        backend, cpu, os_ = _parse_arch(name, arch_parts)
        return Variant(
            name,
            VariantKind.TORCH_ARCH,
            backend,
            torch_version=_two(m.group(1), m.group(2)),
            abi=abi,
            cpu=cpu,
            os=os_,
        )
    if parts[0] == "tvm" and len(parts) >= 2 and parts[1].startswith("ffi"):
        m = _TVM_FFI_RE.fullmatch(parts[1])
        if m is None:
            raise ValueError("malformed tvm-ffi version")
        backend, cpu, os_ = _parse_arch(name, parts[2:])
        return Variant(
            name,
            VariantKind.TVM_FFI,
            backend,
            tvm_ffi_version=_two(m.group(1), m.group(2)),
            cpu=cpu,
            os=os_,
        )
    raise ValueError("unknown framework")


def parse_variant(name: str) -> Variant | UnrecognisedVariant:
    """Parse a `build/` folder name; never raises, so one odd folder cannot break resolution."""
    try:
        return _parse(name)
    except ValueError as exc:
        return UnrecognisedVariant(name, str(exc))


# --------------------------------------------------------------------------------------------
# Platform facts
# --------------------------------------------------------------------------------------------

_VERSION_PREFIX_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)*)")
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
}


def parse_version(text: str | None, *, parts: int | None = None) -> tuple[int, ...] | None:
    """Leading dotted-number prefix of a version string (`2.13.0+cpu` -> (2, 13, 0)).

    With `parts`, the result is cut or zero-padded to that many components. Empty -> None.
    """
    if text is None or not text.strip():
        return None
    m = _VERSION_PREFIX_RE.match(text)
    if m is None:
        raise ValueError(f"not a version: {text!r}")
    try:
        nums = tuple(int(p) for p in m.group(1).split("."))
    except ValueError:  # more digits than int() converts
        raise ValueError(f"not a version: {text[:20]!r}... has too many digits") from None
    if parts is not None:
        nums = (nums + (0,) * parts)[:parts]
    return nums


def _two_part(text: str | None) -> tuple[int, int] | None:
    v = parse_version(text, parts=2)
    return None if v is None else (v[0], v[1])


def _backend_from_obj(obj: Any) -> tuple[Backend, bool]:
    if isinstance(obj, str):
        if obj in _NOARCH_NAMES:
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
    version = _two_part(obj.get("version")) if btype in _VERSION_PREFIX else None
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_capabilities", tuple(self.device_capabilities))
        for name in ("torch_version", "tvm_ffi_version"):
            value = getattr(self, name)
            if value is not None and len(value) != 2:
                raise ValueError(f"{name} must be (major, minor), got {value!r}")
        if len(self.python_version) != 3:
            raise ValueError(f"python_version must be (major, minor, micro): {self.python_version}")

    @property
    def arch_variants_unsupported(self) -> bool:
        """Free-threaded CPython < 3.15 cannot load the abi3 extensions of arch variants."""
        return self.free_threaded and self.python_version[:2] < FREE_THREADED_ABI3_MIN_PYTHON

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
        torch = f"torch {_fmt(self.torch_version)}" if self.torch_version else "no torch"
        if self.cxx11_abi is not None and self.torch_version:
            torch += " cxx11" if self.cxx11_abi else " cxx98"
        bits = [torch, self.backend.label + (" (requested)" if self.backend_explicit else "")]
        bits.append(f"{self.cpu}-{self.os}")
        py = f"Python {_fmt(self.python_version)}"
        bits.append(py + (" free-threaded" if self.free_threaded else ""))
        if self.macos_version:
            bits.append(f"macOS {_fmt(self.macos_version)}")
        if self.tvm_ffi_version:
            bits.append(f"tvm-ffi {_fmt(self.tvm_ffi_version)}")
        if self.device_capabilities:
            bits.append("devices " + ",".join(self.device_capabilities))
        return ", ".join(bits)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; the same field names and spellings as `kerneld.v1.PlatformFacts`."""
        return {
            "torch_version": _fmt(self.torch_version),
            "cxx11_abi": self.cxx11_abi,
            "backend": {
                "type": self.backend.type.value,
                "version": _fmt(self.backend.version),
                "explicit": self.backend_explicit,
            },
            "cpu": self.cpu,
            "os": self.os,
            "free_threaded": self.free_threaded,
            "python_version": _fmt(self.python_version),
            "macos_version": _fmt(self.macos_version),
            "tvm_ffi_version": _fmt(self.tvm_ffi_version),
            "device_capabilities": list(self.device_capabilities),
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


# --------------------------------------------------------------------------------------------
# Acceptance and preference
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The verdict on one variant: `rank` 0 is the best accepted one, -1 means rejected."""

    variant: str
    accepted: bool
    reason: str
    rank: int
    parsed: Variant | None = None


def _missing(what: str, version: tuple[int, int], tool: str) -> str:
    return f"{what} {_fmt(version)} needs {tool}, which is not installed"


def _reject_reason(v: Variant, facts: PlatformFacts) -> str | None:
    """Why `v` cannot be loaded with `facts`, or None; checks in the order `kernels` does."""
    local = facts.backend
    if not v.is_arch:
        if v.kind is VariantKind.UNIVERSAL:
            return None
        assert v.backend is not None
        if v.backend.type.value != local.noarch_name:
            return f"noarch backend {v.backend.type.value} != local backend {local.noarch_name}"
        return None

    assert v.backend is not None
    if facts.arch_variants_unsupported:
        return "free-threaded Python accepts only noarch variants"
    if v.cpu != facts.cpu:
        return f"CPU {v.cpu} != local CPU {facts.cpu}"
    if v.os != facts.os:
        return f"OS {v.os} != local OS {facts.os}"
    if v.kind is VariantKind.TORCH_ARCH:
        assert v.torch_version is not None
        if facts.torch_version is None:
            return _missing("torch", v.torch_version, "torch")
        if v.torch_version != facts.torch_version:
            return f"torch {_fmt(v.torch_version)} != local torch {_fmt(facts.torch_version)}"
        if v.abi is not Abi.NONE and (v.abi is Abi.CXX11) is not facts.cxx11_abi:
            local_abi = {True: "cxx11", False: "cxx98", None: "none"}[facts.cxx11_abi]
            return f"ABI {v.abi.value} != local {local_abi}"
    elif v.kind is VariantKind.STABLE_ABI:
        assert v.torch_version is not None
        if facts.torch_version is None:
            return _missing("stable ABI", v.torch_version, "torch")
        if v.torch_version > facts.torch_version:
            return (
                f"stable ABI {_fmt(v.torch_version)} is newer than the local torch "
                f"{_fmt(facts.torch_version)}"
            )
    else:
        assert v.tvm_ffi_version is not None
        if facts.tvm_ffi_version is None:
            return _missing("tvm-ffi", v.tvm_ffi_version, "tvm-ffi")
        if v.tvm_ffi_version != facts.tvm_ffi_version:
            return (
                f"tvm-ffi {_fmt(v.tvm_ffi_version)} != local tvm-ffi {_fmt(facts.tvm_ffi_version)}"
            )

    if local.type is BackendType.CUDA and v.backend.type is BackendType.CUDA:
        assert v.backend.version is not None
        if local.version is None:
            return f"{v.backend.label} cannot be checked: the local CUDA version is unknown"
        if v.backend.version[0] != local.version[0]:
            return f"{v.backend.label} has another major version than the local {local.label}"
        if v.backend.version[1] > local.version[1]:
            return f"{v.backend.label} is newer than the local {local.label}"
        return None
    # Token equality, as in `kernels` (so `rocm710` matches a local ROCm 7.10).
    if v.backend.token != local.token:
        return f"{v.backend.label} != local {local.label}"
    if v.backend.type is BackendType.METAL and (
        facts.macos_version is None or facts.macos_version[0] < METAL_MIN_MACOS
    ):
        local_mac = _fmt(facts.macos_version) or "unknown"
        return f"Metal needs macOS >= {METAL_MIN_MACOS} (local macOS: {local_mac})"
    return None


_RANKED_BACKENDS = (BackendType.CUDA, BackendType.ROCM, BackendType.XPU, BackendType.CANN)


def _preference(v: Variant) -> tuple[int, int, int, int, int]:
    """Sort key, best first. The first four fields are the key of `kernels`' `_sort_variants`;
    the fifth breaks its one tie (a tvm-ffi variant vs. noarch) in favour of tvm-ffi."""
    if not v.is_arch:
        return (2, 0, 0, 1 if v.kind is VariantKind.UNIVERSAL else 0, 1)
    assert v.backend is not None
    if v.kind is VariantKind.STABLE_ABI:
        assert v.torch_version is not None
        head = (0, -v.torch_version[0], -v.torch_version[1])
    elif v.kind is VariantKind.TORCH_ARCH:
        head = (1, 0, 1 if v.abi is not Abi.NONE else 0)
    else:
        head = (2, 0, 0)
    minor = 0
    if v.backend.type in _RANKED_BACKENDS and v.backend.version is not None:
        minor = -v.backend.version[1]
    return (*head, minor, 0)


def _order(
    item: tuple[str, Variant | UnrecognisedVariant, str | None],
) -> tuple[int, tuple[int, ...], bool, str]:
    name, parsed, reason = item
    if isinstance(parsed, UnrecognisedVariant):
        return (2, (), False, name)
    return (0 if reason is None else 1, _preference(parsed), name != parsed.canonical_name, name)


def decide(variants: Iterable[str], facts: PlatformFacts) -> list[Decision]:
    """Judge every variant name for `facts`: accepted ones best first (rank 0, 1, ...), then
    the rejected ones (rank -1) with their reasons. Duplicate names are judged once."""
    items: list[tuple[str, Variant | UnrecognisedVariant, str | None]] = []
    for name in dict.fromkeys(variants):
        parsed = parse_variant(name)
        reason = UNRECOGNISED if isinstance(parsed, UnrecognisedVariant) else None
        if reason is None:
            assert isinstance(parsed, Variant)
            reason = _reject_reason(parsed, facts)
        items.append((name, parsed, reason))
    items.sort(key=_order)
    decisions: list[Decision] = []
    rank = 0
    for name, parsed, reason in items:
        variant = parsed if isinstance(parsed, Variant) else None
        if reason is None:
            decisions.append(Decision(name, True, "", rank, variant))
            rank += 1
        else:
            decisions.append(Decision(name, False, reason, -1, variant))
    return decisions


def best_variant(variants: Iterable[str], facts: PlatformFacts) -> str | None:
    """The name of the preferred accepted variant, or None when none fits."""
    for decision in decide(variants, facts):
        return decision.variant if decision.accepted else None
    return None


def summarize(decisions: Sequence[Decision], facts: PlatformFacts | None = None) -> str:
    """Multi-line verdict list for `NoCompatibleVariant` and `kerneldctl info`."""
    lines = []
    if facts is not None:
        lines.append(f"platform: {facts.describe()}")
    if not decisions:
        lines.append("(the revision has no build variants)")
    for d in decisions:
        if d.accepted:
            lines.append(f"{d.variant}: accepted" + (" (preferred)" if d.rank == 0 else ""))
        else:
            lines.append(f"{d.variant}: rejected: {d.reason}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Device architectures (metadata.json backend.archs)
# --------------------------------------------------------------------------------------------

_CUDA_ARCH_RE = re.compile(r"([0-9]+)\.([0-9]+)([af]?)(\+PTX)?")
_CAPABILITY_RE = re.compile(r"([0-9]+)\.([0-9]+)")


def _cuda_arch_supports(arch: str, cap: tuple[int, int]) -> bool | None:
    m = _CUDA_ARCH_RE.fullmatch(arch)
    if m is None:
        return None
    try:
        arch_cap = (int(m.group(1)), int(m.group(2)))
    except ValueError:  # more digits than int() converts: not an arch anyone builds for
        return None
    suffix, ptx = m.group(3), m.group(4) is not None
    if suffix == "a":  # architecture-specific: that capability only
        return cap == arch_cap
    if suffix == "f" or not ptx:  # family / plain: same major, same or newer minor
        return cap[0] == arch_cap[0] and cap[1] >= arch_cap[1]
    return cap >= arch_cap  # +PTX: JIT-compiled on any newer device


def arch_compatible(archs: Sequence[str], capability: str) -> tuple[bool, str]:
    """Can a build declaring `archs` run on a device of `capability` (`9.0`, `gfx942`)?

    Loading a kernel without an image for the device can kill the process, so this is checked
    before import. As in `kernels`: no archs, or only archs in an unknown format, means "cannot
    tell", which is allowed; ROCm gfx targets must match exactly (feature flags stripped).
    """
    listed = ", ".join(archs)
    if not archs:
        return True, "the build declares no architectures"
    if capability.startswith("gfx"):
        target = capability.split(":", maxsplit=1)[0]
        if target in archs:
            return True, f"ROCm arch {target} is declared by the build"
        return False, f"ROCm arch {target} is not among the build's architectures: {listed}"
    m = _CAPABILITY_RE.fullmatch(capability)
    try:
        cap = (int(m.group(1)), int(m.group(2))) if m is not None else None
    except ValueError:  # more digits than int() converts
        cap = None
    if cap is None:
        return True, f"device capability {capability[:40]!r} is not understood; not checked"
    verdicts = [_cuda_arch_supports(a, cap) for a in archs]
    if all(v is None for v in verdicts):
        return True, f"the build's architectures are in an unknown format: {listed}"
    for arch, ok in zip(archs, verdicts, strict=True):
        if ok:
            return True, f"CUDA capability {capability} is supported by {arch}"
    return False, f"CUDA capability {capability} is not supported by the build's archs: {listed}"


def device_compatible(
    backend_type: str, archs: Sequence[str], facts: PlatformFacts
) -> tuple[bool, str]:
    """`arch_compatible` for every device in `facts`, applied only where `kernels` checks:
    a CUDA build on a CUDA process or a ROCm build on a ROCm process, with known devices."""
    kinds = {BackendType.CUDA.value, BackendType.ROCM.value}
    btype = backend_type.lower()
    if btype not in kinds or btype != facts.backend.type.value or not facts.device_capabilities:
        return True, "no device architecture check applies"
    for cap in facts.device_capabilities:
        ok, why = arch_compatible(archs, cap)
        if not ok:
            return False, why
    return True, "every device is supported by the build's architectures"
