"""A tiny training job that gets its kernels from the host's kerneld (`make run` runs it).

    python examples/train.py [--steps N] [--summary FILE]

A small MLP model marks its RMSNorm, SiLU-and-mul and squared-ReLU layers with
`use_kernel_forward_from_hub`, exactly as a model written for the `kernels` package does; a kernel
mapping points those names at the example kernels (`kerneld-examples/activation` and
`kerneld-examples/relu2`, version 1); `kernelize` swaps in the kernel layers it can get from
kerneld and keeps PyTorch for the rest. Then a few SGD steps run on random data, on CPU.

The example kernels are compiled C++ ops without a backward (`has_backward = False`, like many
inference kernels), so `kernelize` would keep them off a `Mode.TRAINING` model. Here they serve
the frozen feature extractor (`Mode.INFERENCE`, run under `torch.no_grad()`) while SGD trains
the head: a linear probe. A kernel with a backward is kernelized with `Mode.TRAINING` the same way.

When kerneld cannot help (daemon stopped, kernel denied, no build for this machine) every layer
keeps its PyTorch forward, one warning per layer name says why, and training runs anyway: the
losses match the kernel run's to float tolerance, because both compute the same functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from kerneld_client import loaded_kernels
from kerneld_client.layers import (
    LayerRepository,
    Mode,
    kernelize,
    kernelize_report,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)

ACTIVATION = "kerneld-examples/activation"
RELU2 = "kerneld-examples/relu2"
#: layer name -> the kernel repo and hub layer that serve it on CPU.
KERNEL_MAPPING: dict[str, dict[str, Any]] = {
    "RMSNorm": {"cpu": LayerRepository(ACTIVATION, layer_name="RMSNorm", version=1)},
    "SiluAndMul": {"cpu": LayerRepository(ACTIVATION, layer_name="SiluAndMul", version=1)},
    "ReLU2": {"cpu": LayerRepository(RELU2, layer_name="ReLU2", version=1)},
}


@use_kernel_forward_from_hub("RMSNorm")
class RMSNorm(nn.Module):
    """The PyTorch forward; the kernel layer computes the same and replaces it per instance."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.pow(2).mean(dim=-1, keepdim=True)
        return hidden_states * torch.rsqrt(variance + self.variance_epsilon) * self.weight


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


@use_kernel_forward_from_hub("ReLU2")
class ReLU2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).square()


class Block(nn.Module):
    """Pre-norm residual MLP block: SwiGLU (`gated`) or squared ReLU (Primer)."""

    def __init__(self, hidden: int, inner: int, *, gated: bool) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.up = nn.Linear(hidden, 2 * inner if gated else inner, bias=False)
        self.act: nn.Module = SiluAndMul() if gated else ReLU2()
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(self.act(self.up(self.norm(x))))
        return out


class Model(nn.Module):
    """A frozen backbone of MLP blocks and a trainable linear head."""

    def __init__(self, hidden: int = 64, inner: int = 128, classes: int = 8) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            Block(hidden, inner, gated=True),
            Block(hidden, inner, gated=True),
            Block(hidden, inner, gated=False),
            RMSNorm(hidden),
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        logits: torch.Tensor = self.head(features)
        return logits


#: How a kernel reached this process (`LoadedKernel.source`), in words.
SOURCES = {"index": "index, no RPC", "daemon": "asked the daemon", "hub": "Hub", "local": "local"}


def _describe_kernels() -> str:
    loaded = loaded_kernels()
    if not loaded:
        return "none"
    kernels = ", ".join(f"{k.repo_id}@{k.ref} ({SOURCES.get(k.source, k.source)})" for k in loaded)
    return f"{kernels}; variant {', '.join(sorted({k.variant for k in loaded}))}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="SGD steps (default 20)")
    parser.add_argument("--summary", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    # kernelize warns once per layer name and cause when it keeps PyTorch: show those lines.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    torch.manual_seed(0)
    model = Model()
    model.backbone.requires_grad_(False)
    model.backbone.eval()

    t = time.perf_counter()
    with use_kernel_mapping(KERNEL_MAPPING):
        kernelize(model.backbone, mode=Mode.INFERENCE, device="cpu")
    kernels_s = time.perf_counter() - t
    report = kernelize_report(model.backbone)
    assert report is not None  # kernelize just ran on this model
    kernels = _describe_kernels()
    print(f"kernels ready in {kernels_s * 1000:.1f} ms: {kernels}")
    per_name = Counter(e.layer_name for e in report if e.kernelized)
    names = ", ".join(f"{n}x {name}" for name, n in sorted(per_name.items())) or "none"
    causes = Counter(e.cause.value for e in report if not e.kernelized)
    kept = ", ".join(f"{n} on PyTorch ({cause})" for cause, n in sorted(causes.items()))
    print(
        f"kernelized {len(report.kernelized)}/{len(report)} layers: {names}"
        + (f"; {kept}" if kept else "")
    )

    # Random inputs, labels from a fixed random teacher: the head can learn them.
    inputs = torch.randn(256, 64)
    labels = (inputs @ torch.randn(64, 8)).argmax(dim=-1)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.5)
    losses: list[float] = []
    t = time.perf_counter()
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        cast(Any, loss).backward()  # torch's stubs leave backward untyped
        optimizer.step()
        losses.append(loss.item())
    train_s = time.perf_counter() - t
    print(
        f"trained {args.steps} SGD steps on CPU in {train_s:.2f} s: "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    if args.summary is not None:
        summary = {
            "kernels_s": kernels_s,
            "kernels": [
                {"repo_id": k.repo_id, "ref": k.ref, "variant": k.variant, "source": k.source}
                for k in loaded_kernels()
            ],
            "layers": len(report),
            "kernelized": len(report.kernelized),
            "fallback_causes": dict(causes),
            "losses": losses,
            "train_s": train_s,
        }
        args.summary.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
