"""The job side of scripts/gpu-check, run as a fresh process against the check's daemon.

    python -m examples.gpu_probe resolve|ops|load-kerneld|load-kernels [--repo R] [--path DIR]

Prints one JSON object. `resolve`: the variant kerneld ranks first for this process's facts
(`KERNELD_PLATFORM_JSON` injects a GPU's) and whether its `.so` imports (`--repo`: which CUDA
example, activation-cuda by default). `kernelize`: a model kernelized for `cuda` without a
device keeps PyTorch. `ops`: the CUDA ops against PyTorch references on the GPU: activation's
against the formulas, attention's (flash_attn_func causal and not, GQA, packed sequences, a
padded batch through flash_attn_forward) against torch's scaled_dot_product_attention.
`load-*`: seconds of one warm load in this process, through kerneld or through `kernels` 0.17
from the same variant folders (`--path`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

REPO_ID = "kerneld-examples/activation-cuda"
ATTENTION_REPO_ID = "kerneld-examples/attention-cuda"
#: What `resolve` looks for in each kernel it imports.
EXPORTS = {
    REPO_ID: ("silu_and_mul", "rms_norm"),
    ATTENTION_REPO_ID: ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_forward"),
}
REVISION = "main"
DTYPES = ("float32", "float16", "bfloat16")
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}


def resolve(repo_id: str = REPO_ID) -> dict[str, Any]:
    import kerneld_client

    decisions = kerneld_client.get_kernel_variants(repo_id, revision=REVISION)
    accepted = [d.variant for d in decisions if d.accepted]
    out: dict[str, Any] = {
        "chosen": accepted[0] if accepted else None,
        "rejected": {d.variant: d.reason for d in decisions if not d.accepted},
    }
    try:
        kernel = kerneld_client.get_kernel(repo_id, revision=REVISION, policy="error")
        out["imported"] = kernel.__name__
        out["ops"] = sorted(n for n in EXPORTS[repo_id] if hasattr(kernel, n))
    except Exception as e:  # the report names what failed; the check decides what it means
        out["import_error"] = f"{type(e).__name__}: {e}"
    return out


def ops() -> dict[str, Any]:
    import torch

    import kerneld_client

    if not torch.cuda.is_available():
        return {"error": f"no CUDA device (torch {torch.__version__}, cuda {torch.version.cuda})"}
    kernel = kerneld_client.get_kernel(REPO_ID, revision=REVISION, policy="error")
    torch.manual_seed(0)
    rows = []
    for name in DTYPES:
        dtype = getattr(torch, name)
        x = torch.randn(64, 2 * 4096, device="cuda", dtype=dtype)
        d = x.shape[-1] // 2
        ref = (torch.nn.functional.silu(x[:, :d].float()) * x[:, d:].float()).to(dtype)
        got = kernel.silu_and_mul_alloc(x)
        rows.append(("silu_and_mul", name, (got.float() - ref.float()).abs().max().item()))
        h = torch.randn(64, 4096, device="cuda", dtype=dtype)
        w = torch.randn(4096, device="cuda", dtype=dtype)
        hf = h.float()
        ref = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dtype)
        got = kernel.rms_norm_alloc(h, w, 1e-6)
        rows.append(("rms_norm", name, (got.float() - ref.float()).abs().max().item()))
    rows += attention_rows()
    torch.cuda.synchronize()
    return {
        "device": torch.cuda.get_device_name(),
        "capability": "{}.{}".format(*torch.cuda.get_device_capability()),
        "rows": [
            {"op": op, "dtype": dt, "max_abs_err": err, "ok": err <= TOLERANCE[dt]}
            for op, dt, err in rows
        ],
    }


def _sdpa(q: Any, k: Any, v: Any, *, causal: bool = False, mask: Any = None) -> Any:
    """torch's scaled_dot_product_attention in float32 on (batch, seq, heads, head_size)
    tensors, key/value heads repeated for grouped-query attention: the reference."""
    import torch.nn.functional as F

    group = q.shape[2] // k.shape[2]
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2)


def attention_rows() -> list[tuple[str, str, float]]:
    """The attention example's CUDA build against sdpa, per dtype: flash_attn_func without and
    with the causal mask (8 query heads over 2 key/value heads), flash_attn_varlen_func on two
    packed sequences of different lengths, and flash_attn_forward with a padded batch."""
    import torch

    import kerneld_client

    kernel = kerneld_client.get_kernel(ATTENTION_REPO_ID, revision=REVISION, policy="error")
    rows: list[tuple[str, str, float]] = []
    for name in DTYPES:
        dtype = getattr(torch, name)

        def rand(*shape: int, dtype: Any = dtype) -> Any:
            return torch.randn(*shape, device="cuda", dtype=dtype)

        q, k, v = rand(2, 77, 8, 64), rand(2, 77, 2, 64), rand(2, 77, 2, 64)
        for causal in (False, True):
            got = kernel.flash_attn_func(q, k, v, causal=causal)
            err = (got.float() - _sdpa(q, k, v, causal=causal)).abs().max().item()
            rows.append((f"flash_attn_func causal={causal}", name, err))
        lengths = (19, 150)
        q, k, v = rand(sum(lengths), 4, 128), rand(sum(lengths), 4, 128), rand(sum(lengths), 4, 128)
        cu = torch.tensor([0, lengths[0], sum(lengths)], device="cuda", dtype=torch.int32)
        got = kernel.flash_attn_varlen_func(
            q, k, v, cu, cu, max(lengths), max(lengths), causal=True
        )
        err = 0.0
        for start, end in ((0, lengths[0]), (lengths[0], sum(lengths))):
            one = (t[start:end].unsqueeze(0) for t in (q, k, v))
            ref = _sdpa(*one, causal=True)[0]
            err = max(err, (got[start:end].float() - ref).abs().max().item())
        rows.append(("flash_attn_varlen_func causal", name, err))
        # A left-padded batch as Transformers passes it: the first 5 keys of row 0 masked.
        query, key, value = rand(2, 4, 33, 64), rand(2, 4, 33, 64), rand(2, 4, 33, 64)
        seen = torch.ones(2, 1, 33, 33, device="cuda", dtype=torch.bool).tril()
        seen[0, :, :, :5] = False
        seen[0, :, :5, :5] = torch.eye(5, device="cuda", dtype=torch.bool)  # pad rows see self
        got, _ = kernel.flash_attn_forward(None, query, key, value, seen)
        tr = (t.transpose(1, 2) for t in (query, key, value))
        ref = _sdpa(*tr, mask=seen)
        rows.append(("flash_attn_forward padded", name, (got.float() - ref).abs().max().item()))
    return rows


def cuda_mapped_model() -> tuple[Any, dict[str, Any], Any]:
    """A model whose RMSNorm and SiluAndMul map to the CUDA example kernel (for `cuda` only),
    that mapping, and an input on the CPU: (model, mapping, x). Also the model of
    tests/example_kernels/cuda_torch_probe.py."""
    import torch
    from torch import nn

    import kerneld_client

    @kerneld_client.use_kernel_forward_from_hub("RMSNorm")
    class RMSNorm(nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.rand(hidden) + 0.5)
            self.variance_epsilon = 1e-6

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return x * scale * self.weight

    @kerneld_client.use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = x.shape[-1] // 2
            return torch.nn.functional.silu(x[..., :d]) * x[..., d:]

    mapping = {
        name: {
            "cuda": kerneld_client.LayerRepository(
                repo_id=REPO_ID, revision=REVISION, layer_name=name
            )
        }
        for name in ("RMSNorm", "SiluAndMul")
    }
    return nn.Sequential(RMSNorm(16), SiluAndMul()), mapping, torch.randn(2, 16)


def kernelize_no_device() -> dict[str, Any]:
    """The cuda-mapped model kernelized for `cuda` in a process without a CUDA device: every
    layer must keep its PyTorch forward and compute."""
    import torch

    import kerneld_client

    model, mapping, x = cuda_mapped_model()
    with torch.no_grad():
        expected = model(x)
    with kerneld_client.use_kernel_mapping(mapping, inherit_mapping=False):
        kerneld_client.kernelize(model, mode=kerneld_client.Mode.INFERENCE, device="cuda")
    report = kerneld_client.kernelize_report(model)
    with torch.no_grad():
        same = bool(torch.equal(model(x), expected))
    layers = [] if report is None else list(report)
    return {
        "cuda_available": torch.cuda.is_available(),
        "kernelized": [r.name for r in layers if r.kernelized],
        "kept": {r.name: f"{r.status}: {r.reason}"[:120] for r in layers if not r.kernelized},
        "output_unchanged": same,
    }


def load(through: str, path: str | None) -> dict[str, Any]:
    started = time.perf_counter()
    if through == "kerneld":
        import kerneld_client

        kernel = kerneld_client.get_kernel(REPO_ID, revision=REVISION, policy="error")
    else:
        from pathlib import Path

        import kernels

        if path is None:
            raise SystemExit("load-kernels needs --path (the build's folder holding build/)")
        kernel = kernels.get_local_kernel(Path(path), "activation_cuda")
    return {"through": through, "seconds": time.perf_counter() - started, "module": kernel.__name__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "mode", choices=("resolve", "kernelize", "ops", "load-kerneld", "load-kernels")
    )
    parser.add_argument("--path")
    parser.add_argument("--repo", default=REPO_ID, choices=sorted(EXPORTS))
    args = parser.parse_args(argv)
    if args.mode == "resolve":
        result = resolve(args.repo)
    elif args.mode == "kernelize":
        result = kernelize_no_device()
    elif args.mode == "ops":
        result = ops()
    else:
        result = load(args.mode.removeprefix("load-"), args.path)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
