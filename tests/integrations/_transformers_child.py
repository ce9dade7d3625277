"""Child process: a Transformers user's script, unchanged for kerneld.

    python -m tests.integrations._transformers_child '{"model": "<dir>"}'
    (optional: "repo": the repo RMSNorm is mapped to; "direct": false skips the direct get_kernel)

Creates a tiny randomly initialised Llama in `model` if the folder is empty (no weights are
downloaded), maps `RMSNorm` on CPU to the example kernel's layer with the `kernels` API (CPU is
not a device `KernelConfig` accepts), loads the model with `use_kernels=True` and without, and
compares them. Nothing of kerneld's is imported before Transformers has loaded the model: with
KERNELD_HOOK_KERNELS=1 the start-up hook is what routes it. Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from tests.integrations.tiny_llama import make_model

REPO = "kerneld-examples/activation"


def forward_file(module: Any) -> str:
    return str(Path(module.forward.__func__.__code__.co_filename).resolve())


def main() -> None:
    args = json.loads(sys.argv[1])
    repo = args.get("repo", REPO)
    folder = Path(args["model"])
    if not (folder / "config.json").exists():
        make_model(folder)

    from kernels import LayerRepository, Mode, register_kernel_mapping

    register_kernel_mapping(
        {
            "RMSNorm": {
                "cpu": {Mode.INFERENCE: LayerRepository(repo, layer_name="RMSNorm", version=1)}
            }
        }
    )
    reference = AutoModelForCausalLM.from_pretrained(folder).eval()
    model = AutoModelForCausalLM.from_pretrained(folder, use_kernels=True).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        max_err = (model(ids).logits - reference(ids).logits).abs().max().item()

    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    kernelized = [m for m in norms if m.forward.__func__.__qualname__ == "RMSNorm.forward"]
    # What lazy_load_kernel and attn_implementation="org/repo" call: Transformers' get_kernel.
    from transformers.integrations.hub_kernels import get_kernel

    direct = get_kernel(repo, version=1) if args.get("direct", True) else None

    import kerneld_client
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {
                "norms": len(norms),
                "kernelized": len(kernelized),
                "layer_files": sorted({forward_file(m) for m in kernelized}),
                "max_err": max_err,
                "direct_file": None if direct is None else str(Path(direct.__file__).resolve()),
                "kerneld_sources": [k.source for k in kerneld_client.loaded_kernels()],
                "hooked": hook.installed(),
                "grpc": "grpc" in sys.modules,
            }
        )
    )


if __name__ == "__main__":
    main()
