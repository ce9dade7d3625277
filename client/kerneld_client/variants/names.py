"""Build-variant names: their grammar, the backends they name, and their parsed form.

A folder under `build/` is a variant when its name parses (`torch213-cxx11-cu130-x86_64-linux`,
`torch-stable-abi210-cpu-aarch64-linux`, `torch-universal`, ...); anything else is
`UnrecognisedVariant` with the reason, and is never loaded.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from kerneld_client.variants.versions import dotted

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
VERSION_PREFIX: dict[BackendType, str] = {
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
NOARCH_NAMES = {t.value for t in BackendType}


@dataclass(frozen=True)
class Backend:
    """A backend and, for CUDA/ROCm/XPU/CANN, its major.minor toolkit version."""

    type: BackendType
    version: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", BackendType(self.type))
        if self.version is not None:
            if self.type not in VERSION_PREFIX:
                raise ValueError(f"backend {self.type.value} has no version")
            if len(self.version) != 2 or not all(
                isinstance(p, int) and p >= 0 for p in self.version
            ):
                raise ValueError(f"backend version must be (major, minor), got {self.version!r}")

    @property
    def token(self) -> str:
        """The variant-name spelling: `cu130`, `rocm64`, `cpu` (`cuda` when unversioned)."""
        prefix = VERSION_PREFIX.get(self.type)
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
        if self.type in VERSION_PREFIX:
            return f"{name} {dotted(self.version)}" if self.version else f"{name} (version unknown)"
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
_PREFIX_TYPE = {prefix: t for t, prefix in VERSION_PREFIX.items()}


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
        if rest in NOARCH_NAMES:
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
