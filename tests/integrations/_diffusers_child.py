"""Child process: a Diffusers user running its Hub attention backends, on CPU.

    python -m tests.integrations._diffusers_child '{"backends": ["flash_hub", ...]}'

For each backend: `attention_backend(name)` (which loads the kernel, after Diffusers' publisher
question) around `dispatch_attention_fn` on small (batch, seq, heads, head_dim) tensors, causal
and not, compared with Diffusers' native backend (PyTorch's SDPA). A backend that fails is
reported with its exception's type and message. Nothing of kerneld's is imported before the
backends ran: with KERNELD_HOOK_KERNELS=1 the start-up hook routes `kernels`. Prints one JSON
object."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch
from diffusers.models import attention_dispatch as ad


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 6, 2, 16, generator=gen) for _ in range(3))  # type: ignore[return-value]


def _run(backend: str) -> dict[str, Any]:
    q, k, v = _qkv()
    errors = []
    try:
        with ad.attention_backend(backend):
            for causal in (False, True):
                out = ad.dispatch_attention_fn(q, k, v, is_causal=causal)
                want = ad.dispatch_attention_fn(q, k, v, is_causal=causal, backend="native")
                errors.append((out - want).abs().max().item())
    except Exception as exc:
        return {"error": [type(exc).__name__, str(exc)]}
    fn = ad._HUB_KERNELS_REGISTRY[ad.AttentionBackendName(backend)].kernel_fn
    return {"max_err": max(errors), "file": fn.__code__.co_filename}


def main() -> None:
    args = json.loads(sys.argv[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = {backend: _run(backend) for backend in args["backends"]}

    import diffusers
    import kernels

    import kerneld_client
    from kerneld_client.integrations import diffusers as diffusers_hook
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {
                "results": results,
                "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                "kerneld_sources": sorted({k.source for k in kerneld_client.loaded_kernels()}),
                "kerneld_repos": sorted({k.repo_id for k in kerneld_client.loaded_kernels()}),
                "hooked": hook.installed(),
                "attached": diffusers_hook.attached(),
                "trust_env": ad.DIFFUSERS_TRUST_REMOTE_KERNELS,
                "grpc": "grpc" in sys.modules,
                "diffusers": diffusers.__version__,
                "kernels": kernels.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
