"""Build-variant names: their grammar, the backends they name, and their parsed form.

A folder under `build/` is a variant when its name parses. Two formats, as in `kernels` 0.19.1:

- legacy (what `kernels` 0.17.2 knows): `torch213-cxx11-cu130-x86_64-linux`,
  `torch-stable-abi210-cpu-aarch64-linux`, `tvm-ffi01-cu128-x86_64-linux`, `torch-cpu`,
  `torch-universal`; implicitly `cpython-3.9-abi3`;
- new: `{framework}-{M.m}[-cxx11]-{backend}[-{M.m}]-cpython-{M.m}-{abi3|abi3t}-{cpu}-{os}`
  (`torch-2.13-cxx11-cpu-cpython-3.9-abi3-x86_64-linux`, `torch-stable-abi-2.11-cuda-12.8-...`,
  `tvm-ffi-0.1-...`), where `cpython-M.m` is the minimum Python; SDK builds
  `sdk[-<backend>[-M.m]][-cpython-M.m-<abi>-<cpu>-<os>]` (no framework; the backend may be absent)
  and the MLX noarch form `mlx-<backend>` (`mlx-metal`).

Anything else is `UnrecognisedVariant` with the reason, and is never loaded.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from kerneld_client.variants.versions import dotted

#: The rejection reason of a folder name that is not a build variant at all.
UNRECOGNISED = "unrecognised variant name"
#: The free-threaded stable ABI (`abi3t`, PEP 803) needs at least this Python.
ABI3T_MIN_PYTHON = (3, 15)
#: Metal kernels are built with `-std=metal4.0`, which needs this macOS major version.
METAL_MIN_MACOS = 26
#: The minimum Python of a legacy arch name (`kernels`: implicitly `cpython-3.9-abi3`).
LEGACY_PYTHON = (3, 9)
#: The marker that starts the Python part of a new-format name.
PYTHON_MARKER = "cpython"


class VariantKind(str, enum.Enum):
    """What a build variant was built against; decides which facts it is checked against."""

    TORCH_ARCH = "torch-arch"
    STABLE_ABI = "stable-abi"
    TVM_FFI = "tvm-ffi"
    NOARCH = "noarch"
    UNIVERSAL = "universal"
    #: `mlx-<backend>` (new format only): pure Python for MLX, needs MLX installed.
    MLX_NOARCH = "mlx-noarch"
    #: `sdk...` (new format only): no framework; compiled when it names a Python and a system.
    SDK = "sdk"


class PythonAbi(str, enum.Enum):
    """The Python ABI of a new-format name's compiled parts (PEP 384 / PEP 803)."""

    ABI3 = "abi3"
    #: The free-threaded stable ABI; needs Python >= 3.15 (also loads on GIL builds >= 3.15).
    ABI3T = "abi3t"


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
    # Only a noarch name (`torch-npu`): what `kernels` before 0.19 loaded on a CANN machine,
    # which 0.19.1 rejects there (it loads `torch-cann`); parsed so the reason can say so.
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
# Recognised `torch-<name>` noarch names: a backend's own name matches it (a CANN machine loads
# `torch-cann`, as in `kernels` 0.19.1); `torch-npu` parses but never matches.
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
        """The legacy spelling: `cu130`, `rocm64`, `cpu` (`cuda` when unversioned)."""
        prefix = VERSION_PREFIX.get(self.type)
        if prefix is None or self.version is None:
            return self.type.value
        return f"{prefix}{self.version[0]}{self.version[1]}"

    @property
    def new_token(self) -> str:
        """The new-format spelling: `cuda-13.0`, `rocm-6.4`, `cpu`."""
        if self.type not in VERSION_PREFIX or self.version is None:
            return self.type.value
        return f"{self.type.value}-{dotted(self.version)}"

    @property
    def label(self) -> str:
        """Human spelling for messages: `CUDA 13.0`, `CPU`."""
        name = _LABEL[self.type]
        if self.type in VERSION_PREFIX:
            return f"{name} {dotted(self.version)}" if self.version else f"{name} (version unknown)"
        return name


_ARCH_KINDS = frozenset({VariantKind.TORCH_ARCH, VariantKind.STABLE_ABI, VariantKind.TVM_FFI})


@dataclass(frozen=True)
class Variant:
    """A parsed build-variant folder name.

    `torch_version` is the torch version of a torch-arch variant and the ABI version of a
    stable-ABI variant. `backend` is None for `torch-universal`, `mlx-universal` and the SDK
    builds that name none. `cpu`/`os` are set for arch variants and compiled SDK builds;
    `python_min`/`python_abi` too (`cpython-3.9-abi3` for every legacy arch name). `legacy`:
    the name is in the format `kernels` 0.17.2 knows (judged, like every name, by 0.19.1's rules).
    """

    name: str
    kind: VariantKind
    backend: Backend | None
    torch_version: tuple[int, int] | None = None
    tvm_ffi_version: tuple[int, int] | None = None
    abi: Abi = Abi.NONE
    cpu: str | None = None
    os: str | None = None
    python_min: tuple[int, int] | None = None
    python_abi: PythonAbi | None = None
    legacy: bool = True

    @property
    def is_arch(self) -> bool:
        """Arch variants hold a native extension built against a framework; noarch ones and
        framework-free SDK builds do not."""
        return self.kind in _ARCH_KINDS

    @property
    def compiled(self) -> bool:
        """Holds compiled parts for one Python, CPU and OS (arch variants, compiled SDKs)."""
        return self.cpu is not None

    def _python_suffix(self) -> str:
        if self.legacy or self.python_min is None or self.python_abi is None:
            return ""
        return f"-{PYTHON_MARKER}-{dotted(self.python_min)}-{self.python_abi.value}"

    @property
    def canonical_name(self) -> str:
        """The name `kernels` writes for this variant (it normalises `torch2013` to `torch213`
        and `torch-2.013` to `torch-2.13`)."""
        if self.kind is VariantKind.UNIVERSAL:
            return "torch-universal"
        if self.kind is VariantKind.NOARCH:
            assert self.backend is not None
            return f"torch-{self.backend.type.value}"
        if self.kind is VariantKind.MLX_NOARCH:
            return f"mlx-{self.backend.type.value if self.backend else 'universal'}"
        if self.kind is VariantKind.SDK:
            parts = ["sdk"]
            if self.backend is not None:
                parts.append(self.backend.new_token if self.compiled else self.backend.type.value)
            tail = self._python_suffix()
            return "-".join(parts) + tail + (f"-{self.cpu}-{self.os}" if self.compiled else "")
        assert self.backend is not None
        legacy = self.legacy
        if self.kind is VariantKind.TORCH_ARCH:
            assert self.torch_version is not None
            framework = _framework_name("torch", "torch-", self.torch_version, legacy)
            if self.abi is not Abi.NONE:
                framework += f"-{self.abi.value}"
        elif self.kind is VariantKind.STABLE_ABI:
            assert self.torch_version is not None
            version = self.torch_version
            framework = _framework_name("torch-stable-abi", "torch-stable-abi-", version, legacy)
        else:
            assert self.tvm_ffi_version is not None
            framework = _framework_name("tvm-ffi", "tvm-ffi-", self.tvm_ffi_version, legacy)
        backend = self.backend.token if legacy else self.backend.new_token
        return f"{framework}-{backend}{self._python_suffix()}-{self.cpu}-{self.os}"


def _framework_name(legacy_prefix: str, prefix: str, version: tuple[int, int], legacy: bool) -> str:
    if legacy:
        return f"{legacy_prefix}{version[0]}{version[1]}"
    return f"{prefix}{dotted(version)}"


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
_NEW_TORCH_RE = re.compile(r"torch-([0-9]+)\.([0-9]+)")
_STABLE_RE = re.compile(r"torch-stable-abi([0-9])([0-9]+)")
_NEW_STABLE_RE = re.compile(r"torch-stable-abi-([0-9]+)\.([0-9]+)")
_TVM_FFI_RE = re.compile(r"tvm-ffi([0-9])([0-9]+)")
_NEW_TVM_FFI_RE = re.compile(r"tvm-ffi-([0-9]+)\.([0-9]+)")
_DOTTED_RE = re.compile(r"([0-9]+)\.([0-9]+)")
# Greedy major: the minor is the last digit only (`cu1210` is 121.0, as in `kernels`).
_VERSIONED_RE = re.compile(r"(cu|rocm|xpu|cann)([0-9]+)([0-9])")
# The exception `kernels` 0.19.1 makes: `rocm714` is ROCm 7.14, not 71.4.
_TWO_DIGIT_MINOR_TOKENS = {"rocm714": (7, 14)}
_PREFIX_TYPE = {prefix: t for t, prefix in VERSION_PREFIX.items()}
_VERSIONED_NAMES = {t.value: t for t in VERSION_PREFIX}


def _two(major: str, minor: str) -> tuple[int, int]:
    # int() refuses > 4300 digits with ValueError; callers turn that into "unrecognised".
    return int(major), int(minor)


def _version(pattern: re.Pattern[str], text: str, what: str) -> tuple[int, int]:
    m = pattern.fullmatch(text)
    if m is None:
        raise ValueError(f"malformed {what} {text!r}")
    return _two(m.group(1), m.group(2))


def parse_backend(token: str) -> Backend:
    """Parse a legacy backend token (`cu128`, `rocm64`, `xpu20253`, `cpu`); ValueError."""
    if token in _PLAIN_ARCH_TOKENS:
        return Backend(BackendType(token))
    m = _VERSIONED_RE.fullmatch(token)
    if m is None:
        raise ValueError(f"unknown backend token {token!r}")
    version = _TWO_DIGIT_MINOR_TOKENS.get(token) or _two(m.group(2), m.group(3))
    return Backend(_PREFIX_TYPE[m.group(1)], version)


def parse_new_backend(parts: list[str]) -> Backend:
    """Parse the backend of a new-format name (`["cuda", "12.8"]`, `["cpu"]`); ValueError."""
    if len(parts) == 1 and parts[0] in _PLAIN_ARCH_TOKENS:
        return Backend(BackendType(parts[0]))
    if len(parts) == 2 and parts[0] in _VERSIONED_NAMES:
        return Backend(_VERSIONED_NAMES[parts[0]], _version(_DOTTED_RE, parts[1], "version"))
    raise ValueError(f"unknown backend {'-'.join(parts)!r}")


def _split_system(parts: list[str]) -> tuple[list[str], str, str]:
    """The parts before `<cpu>-<os>`, and those two (any strings: they only have to match)."""
    if len(parts) < 2:
        raise ValueError("expected <cpu>-<os> at the end")
    return parts[:-2], parts[-2], parts[-1]


def _split_python(parts: list[str]) -> tuple[list[str], tuple[int, int], PythonAbi] | None:
    """The parts before `cpython-<M.m>-<abi>` and those two; None without the marker."""
    if PYTHON_MARKER not in parts:
        return None
    i = parts.index(PYTHON_MARKER)
    tail = parts[i:]
    if len(tail) != 3:
        raise ValueError(f"expected {PYTHON_MARKER}-<M.m>-<abi>, got {'-'.join(tail)!r}")
    version = _version(_DOTTED_RE, tail[1], "Python version")
    try:
        abi = PythonAbi(tail[2])
    except ValueError:
        raise ValueError(f"unknown Python ABI {tail[2]!r}") from None
    if abi is PythonAbi.ABI3T and version < ABI3T_MIN_PYTHON:
        raise ValueError(f"abi3t needs Python >= 3.15, the name says {dotted(version)}")
    return parts[:i], version, abi


def _known_backend(name: str) -> Backend:
    """A bare backend name (`torch-cpu`, `mlx-metal`, `sdk-cuda`); `kernels` takes any string
    there but can only ever accept a real backend's name, so others are unrecognised here."""
    if name not in NOARCH_NAMES:
        raise ValueError(f"unknown backend {name!r}")
    return Backend(BackendType(name))


def _parse_sdk(name: str, rest: list[str]) -> Variant:
    if PYTHON_MARKER not in rest:
        if not rest:  # `sdk`: backend-agnostic, nothing compiled
            return Variant(name, VariantKind.SDK, None, legacy=False)
        if len(rest) != 1:
            raise ValueError("expected sdk-<backend> without a Python part")
        return Variant(name, VariantKind.SDK, _known_backend(rest[0]), legacy=False)
    before, cpu, os_ = _split_system(rest)
    split = _split_python(before)
    if split is None:
        raise ValueError("the Python part must come before <cpu>-<os>")
    backend_parts, python, abi = split
    backend = parse_new_backend(backend_parts) if backend_parts else None
    return Variant(
        name,
        VariantKind.SDK,
        backend,
        cpu=cpu,
        os=os_,
        python_min=python,
        python_abi=abi,
        legacy=False,
    )


def _parse(name: str) -> Variant:
    """Dispatch on the framework as `kernels` 0.19.1's `parse_variant` does, in its order."""
    parts = name.split("-")
    torch_version: tuple[int, int] | None = None
    tvm_ffi_version: tuple[int, int] | None = None
    abi = Abi.NONE
    if parts[0] == "sdk":
        return _parse_sdk(name, parts[1:])
    if name.startswith("torch-stable-abi"):
        legacy = not (len(parts) > 3 and parts[2] == "abi")
        n = 3 if legacy else 4
        pattern = _STABLE_RE if legacy else _NEW_STABLE_RE
        torch_version = _version(pattern, "-".join(parts[:n]), "stable-ABI version")
        kind = VariantKind.STABLE_ABI
    elif parts[0] == "torch" and len(parts) >= 2 and parts[1][:1].isdigit():
        legacy = False
        n = 3 if len(parts) >= 3 and parts[2] in ("cxx11", "cxx98") else 2
        torch_version = _version(_NEW_TORCH_RE, "-".join(parts[:2]), "torch version")
        abi = Abi(parts[2]) if n == 3 else Abi.NONE
        kind = VariantKind.TORCH_ARCH
    elif parts[0] == "torch":
        rest = "-".join(parts[1:])
        if rest == "universal":
            return Variant(name, VariantKind.UNIVERSAL, None)
        return Variant(name, VariantKind.NOARCH, _known_backend(rest))
    elif parts[0] == "mlx" and len(parts) >= 2 and not parts[1][:1].isdigit():
        rest = "-".join(parts[1:])
        backend = None if rest == "universal" else _known_backend(rest)
        return Variant(name, VariantKind.MLX_NOARCH, backend, legacy=False)
    elif parts[0].startswith("torch"):
        legacy = True
        n = 2 if len(parts) >= 2 and parts[1] in ("cxx11", "cxx98") else 1
        torch_version = _version(_TORCH_RE, parts[0], "torch version")
        abi = Abi(parts[1]) if n == 2 else Abi.NONE
        kind = VariantKind.TORCH_ARCH
    elif parts[0] == "tvm" and len(parts) >= 2 and parts[1].startswith("ffi"):
        legacy = not (len(parts) > 2 and parts[1] == "ffi")
        n = 2 if legacy else 3
        pattern = _TVM_FFI_RE if legacy else _NEW_TVM_FFI_RE
        tvm_ffi_version = _version(pattern, "-".join(parts[:n]), "tvm-ffi version")
        kind = VariantKind.TVM_FFI
    else:
        raise ValueError("unknown framework")

    before, cpu, os_ = _split_system(parts[n:])
    if legacy:
        if len(before) != 1:
            raise ValueError("expected one backend token before <cpu>-<os>")
        backend = parse_backend(before[0])
        python, python_abi = LEGACY_PYTHON, PythonAbi.ABI3
    else:
        split = _split_python(before)
        if split is None:
            raise ValueError(f"missing the Python part ({PYTHON_MARKER}-<M.m>-<abi>)")
        backend_parts, python, python_abi = split
        if not backend_parts:
            raise ValueError("missing the backend")
        backend = parse_new_backend(backend_parts)
    return Variant(
        name,
        kind,
        backend,
        torch_version=torch_version,
        tvm_ffi_version=tvm_ffi_version,
        abi=abi,
        cpu=cpu,
        os=os_,
        python_min=python,
        python_abi=python_abi,
        legacy=legacy,
    )


def parse_variant(name: str) -> Variant | UnrecognisedVariant:
    """Parse a `build/` folder name; never raises, so one odd folder cannot break resolution."""
    try:
        return _parse(name)
    except ValueError as exc:
        return UnrecognisedVariant(name, str(exc))
