"""A tiny randomly initialised Llama saved to a folder (no weights downloaded), whose RMSNorm
weights are not all 1, so that a kernelized norm that ignored them would show in the logits.

Imports only torch and transformers: the children of the Transformers tests use it, including
those run in throw-away venvs where nothing of kerneld's is importable."""

from __future__ import annotations

from pathlib import Path


def make_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
