"""The attention example kernel from the host's kerneld, checked against PyTorch's attention
(`make run` runs it).

    python examples/attention.py [--summary FILE]

Gets `kerneld-examples/attention` (version 2, its newest) through `kerneld_client.get_kernel`,
as a job asking for a Hub attention kernel (flash-attn's interface) would, and compares it with
`torch.nn.functional.scaled_dot_product_attention` on random inputs: `flash_attn_func` without
and with the causal mask (8 query heads over 2 key/value heads), and `flash_attn_forward`, the
form Transformers registers as an attention function, on a left-padded batch. Prints the largest
difference of each; exits 1 when one exceeds float32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kerneld_client

ATTENTION = "kerneld-examples/attention"
TOLERANCE = 1e-5
#: How the kernel reached this process (`LoadedKernel.source`), in words (as train.py says it).
SOURCES = {"index": "index, no RPC", "daemon": "asked the daemon", "hub": "Hub", "local": "local"}


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch's attention on (batch, seq, heads, head_size), key/value heads repeated."""
    group = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).transpose(1, 2)


def compare(kernel: Any) -> dict[str, float]:
    """Largest absolute difference to sdpa per case."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 48, 8, 32), torch.randn(2, 48, 2, 32), torch.randn(2, 48, 2, 32)
    diffs = {}
    for causal in (False, True):
        got = kernel.flash_attn_func(q, k, v, causal=causal)
        diffs[f"causal={causal}"] = (got - sdpa(q, k, v, causal=causal)).abs().max().item()
    # A left-padded batch as Transformers passes it: row 0's first 6 positions are padding.
    query, key, value = (torch.randn(2, 4, 20, 32) for _ in range(3))
    seen = torch.ones(2, 1, 20, 20, dtype=torch.bool).tril()
    seen[0, :, :, :6] = False
    seen[0, :, :6, :6] = torch.eye(6, dtype=torch.bool)  # padding rows see only themselves
    got, _ = kernel.flash_attn_forward(torch.nn.Module(), query, key, value, seen)
    ref = sdpa(*(t.transpose(1, 2) for t in (query, key, value)), mask=seen)
    diffs["padded batch"] = (got - ref).abs().max().item()
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    t = time.perf_counter()
    kernel = kerneld_client.get_kernel(ATTENTION, version=2)
    load_s = time.perf_counter() - t
    loaded = next(k for k in kerneld_client.loaded_kernels() if k.repo_id == ATTENTION)
    diffs = compare(kernel)
    worst = max(diffs.values())
    shown = ", ".join(f"{case} {diff:.1e}" for case, diff in diffs.items())
    source = SOURCES.get(loaded.source, loaded.source)
    print(
        f"{ATTENTION}@{loaded.ref} ({source}, {load_s * 1000:.1f} ms, {loaded.variant}); "
        f"vs torch scaled_dot_product_attention, max difference: {shown}"
    )
    if args.summary is not None:
        summary = {"diffs": diffs, "variant": loaded.variant, "source": loaded.source}
        args.summary.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    if worst > TOLERANCE:
        print(f"FAILED: the kernel differs from sdpa by {worst:.1e} (> {TOLERANCE:g})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
