"""Tiny randomly initialised causal LMs of four families -- Llama, Qwen2, Mixtral, Qwen3-MoE --
saved to a folder (no weights downloaded), whose RMSNorm weights are not all 1, so that a
kernelized norm that ignored them would show in the logits.

Imports only torch and transformers: the children of the Transformers tests and the bench use
it, including in throw-away venvs where nothing of kerneld's is importable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen2", "mixtral", "qwen3_moe")
VOCAB = 128

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
}


def _config(family: str) -> Any:
    import transformers

    if family == "llama":
        return transformers.LlamaConfig(**_COMMON)
    if family == "qwen2":
        return transformers.Qwen2Config(**_COMMON)
    if family == "mixtral":
        return transformers.MixtralConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **_COMMON,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
        )
    raise ValueError(f"unknown model family {family!r}; one of {FAMILIES}")


def make_model(folder: Path, family: str = "llama") -> None:
    """Save a tiny `family` model to `folder` (created), seeded, norms in [0.5, 1.5]."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(family))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
