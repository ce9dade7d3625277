"""Small pure-PyTorch kernels in Hub layout, written by tests (each with a unique metadata id).

They are real kernels (a `metadata.json` with digests, a package with `layers`), loaded by the
real client, for the cases the example kernels do not cover: layers declaring determinism,
broken metadata, import errors, mismatched signatures, GPU-only builds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

#: Layers computing what tests/layers/model.py computes; `{flags}` lands in every class body.
_RMS_FORWARD = """def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    xf = hidden_states.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
    return (normed * self.weight.float()).to(hidden_states.dtype)
"""

#: Layers computing what tests/layers/model.py computes; the placeholders land in class bodies.
DEFAULT_LAYERS = """
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    has_backward = True
    can_torch_compile = True
{rms_extra}
{rms_forward}

class SiluAndMul(nn.Module):
    has_backward = True
    can_torch_compile = True
{silu_extra}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
"""


def layers_source(
    rms_extra: str = "", silu_extra: str = "", rms_forward: str = _RMS_FORWARD
) -> str:
    """The default layers, with extra class-body text and/or another RMSNorm forward."""
    indent = "    "
    return DEFAULT_LAYERS.format(
        rms_extra=textwrap.indent(rms_extra, indent),
        silu_extra=textwrap.indent(silu_extra, indent),
        rms_forward=textwrap.indent(rms_forward, indent),
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def write_kernel(
    root: Path,
    *,
    layers: str | None = None,
    init: str = "from . import layers\n",
    variant: str = "torch-universal",
    backend: dict[str, Any] | None = None,
    extra_metadata: dict[str, Any] | None = None,
    raw_metadata: bytes | None = None,
) -> Path:
    """Write `root/build/<variant>/` and return `root` (a local kernel repo)."""
    kid = f"_synth_{uuid.uuid4().hex[:10]}"
    folder = root / "build" / variant
    folder.mkdir(parents=True)
    files = {
        "__init__.py": init.encode(),
        "layers.py": (layers if layers is not None else layers_source()).encode(),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    doc: dict[str, Any] = {
        "id": kid,
        "name": "synth",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": backend or {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": {p: _b64(b) for p, b in files.items()}},
    }
    doc.update(extra_metadata or {})
    (folder / "metadata.json").write_bytes(raw_metadata or json.dumps(doc).encode())
    return root
