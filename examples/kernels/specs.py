"""What the example kernels are: their names, sources, ops per version and storage.

The build, its cache and the Hub repos all read these facts; keeping them apart from the code
that acts on them lets each of those modules import them without importing one another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORG = "kerneld-examples"
VERSIONS = (1, 2)
LICENSE = "Apache-2.0"
KERNELS_MINVER = "0.17.0"
# Noarch variants register their ops for this dispatch key: CPU-only vs any device.
NOARCH_DISPATCH_KEYS = {"torch-cpu": "CPU", "torch-universal": "CompositeExplicitAutograd"}


class BuildError(RuntimeError):
    """A compile or git step failed; the message carries the tool's output."""


@dataclass(frozen=True)
class KernelSpec:
    """One example kernel: its sources live in examples/kernels/<name>/."""

    name: str
    summary: str
    sources: tuple[str, ...]  # C++ sources relative to the kernel folder
    ops: Mapping[int, tuple[str, ...]]  # op names per kernel version
    noarch: tuple[str, ...] = ()  # noarch variants (need a torch-noarch/ overlay)
    lfs: bool = False  # store the native library through git LFS in the Hub repo
    # `legacy` (`torch213-cxx11-cpu-x86_64-linux`) or `new` (kernels 0.19's
    # `torch-2.13-cxx11-cpu-cpython-3.9-abi3-x86_64-linux`): how its arch variant is named.
    name_format: str = "legacy"
    zip_versions: tuple[int, ...] = ()  # versions built with `build-layout: zip`
    source_kernel: str | None = None  # another kernel whose folder holds its sources

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def directory(self) -> Path:
        return HERE / (self.source_kernel or self.name)

    @property
    def package_name(self) -> str:
        """The package folder under torch-ext/ (and torch-noarch/) in `directory`."""
        return (self.source_kernel or self.name).replace("-", "_")

    def layout(self, version: int) -> str:
        """`files` or `zip`: the metadata `build-layout` of this version's builds."""
        return "zip" if version in self.zip_versions else "files"


KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec(
        name="activation",
        summary="Activations (SiLU, GELU; plain and gated) and RMSNorm, CPU ops plus a "
        "pure-PyTorch variant",
        sources=("csrc/activation.cpp",),
        ops={
            1: ("silu_and_mul", "gelu_tanh_and_mul", "rms_norm", "silu", "gelu_tanh"),
            2: (
                "silu_and_mul",
                "gelu_tanh_and_mul",
                "rms_norm",
                "silu",
                "gelu_tanh",
                "gelu_and_mul",
            ),
        },
        noarch=("torch-cpu", "torch-universal"),
        lfs=True,
    ),
    KernelSpec(
        name="relu2",
        summary="Squared ReLU, a small second kernel with its own op namespace",
        sources=("csrc/relu2.cpp",),
        ops={1: ("relu2",), 2: ("relu2", "relu2_and_mul")},
    ),
    KernelSpec(
        name="rotary",
        summary="Rotary position embedding, a function kernel (Transformers' rotary_pos_emb)",
        sources=("csrc/rotary.cpp",),
        ops={1: ("apply_rotary",), 2: ("apply_rotary",)},
    ),
    KernelSpec(
        name="attention",
        summary="Attention with flash-attn's interface (flash_attn_func, "
        "flash_attn_varlen_func) and Transformers' flash_attn_forward form, on CPU",
        sources=("csrc/attention.cpp",),
        ops={
            1: ("varlen_attention", "masked_attention"),
            2: ("varlen_attention", "masked_attention"),
        },
    ),
    KernelSpec(
        name="relu2-next",
        summary="relu2 built as kernels 0.19 builds: its arch variant under the new name "
        "format, and v2 as a zip build (build-layout: zip)",
        sources=("csrc/relu2.cpp",),
        ops={1: ("relu2",), 2: ("relu2", "relu2_and_mul")},
        name_format="new",
        zip_versions=(2,),
        source_kernel="relu2",
    ),
)
