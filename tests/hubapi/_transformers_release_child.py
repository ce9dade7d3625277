"""Child process of a throw-away venv: a released Transformers (and the `kernels` it requires),
unmodified, loading a tiny random Llama with `use_kernels=True`.

    python _transformers_release_child.py '{"model": "<dir>", "repo": "org/name"}'

Run by path: nothing of kerneld's is importable here. RMSNorm on CPU is mapped to the example
kernel's layer with the `kernels` API (CPU is not a device `KernelConfig` accepts). Prints one
JSON object: versions, how many RMSNorm layers there are and how many run the kernel's forward,
the files those forwards come from, and the largest difference of the logits from PyTorch's.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path


def main() -> None:
    args = json.loads(sys.argv[1])
    import torch
    from kernels import LayerRepository, Mode, register_kernel_mapping
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    folder = Path(args["model"])
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
    with torch.no_grad():  # RMSNorm weights start at 1: make them tell the kernel's use apart
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)

    register_kernel_mapping(
        {
            "RMSNorm": {
                "cpu": {
                    Mode.INFERENCE: LayerRepository(args["repo"], layer_name="RMSNorm", version=1)
                }
            }
        }
    )
    reference = AutoModelForCausalLM.from_pretrained(folder, use_kernels=False).eval()
    kernelized = AutoModelForCausalLM.from_pretrained(folder, use_kernels=True).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        max_err = (kernelized(ids).logits - reference(ids).logits).abs().max().item()
    norms = [m for m in kernelized.modules() if type(m).__name__ == "LlamaRMSNorm"]
    swapped = [m for m in norms if m.forward.__func__.__qualname__ == "RMSNorm.forward"]
    files = {str(Path(m.forward.__func__.__code__.co_filename).resolve()) for m in swapped}
    print(
        json.dumps(
            {
                "transformers": version("transformers"),
                "kernels": version("kernels"),
                "norms": len(norms),
                "kernelized": len(swapped),
                "layer_files": sorted(files),
                "max_err": max_err,
            }
        )
    )


if __name__ == "__main__":
    main()
