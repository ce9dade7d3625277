"""Child process: a Transformers user's script, unchanged for kerneld.

    python -m tests.integrations._transformers_child '{"model": "<dir>"}'
    (optional: "repo": the repo RMSNorm is mapped to; "kinds": the layer kinds to map, default
    all three; "direct": false skips the direct get_kernel; "api": "kerneld" maps and
    kernelizes with kerneld's own layer API instead of `use_kernels=True`)

Creates a tiny randomly initialised Llama in `model` if the folder is empty (no weights are
downloaded), maps three of Llama's hub layer kinds on CPU with the `kernels` API (CPU is not a
device `KernelConfig` accepts) to the example kernels -- `RMSNorm` (a layer with weights),
`SiLU` (an elementwise activation) and `rotary_pos_emb` (a function kernel) -- runs the model
without kernels, then loads it with `use_kernels=True` and compares the logits. The reference
runs first: under `kernels` before 0.19 the rotary function is one module shared by every
model in the process, so once kernelized it stays so (kerneld and 0.19 kernelize it per
instance). Nothing of kerneld's is imported before
Transformers has loaded the model: with KERNELD_HOOK_KERNELS=1 the start-up hook is what routes
it. Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from tests.integrations.tiny_llama import make_model

ACTIVATION = "kerneld-examples/activation"
ROTARY = "kerneld-examples/rotary"
# Llama's hub layer kind -> (the Transformers class (or function module) it marks, the example
# layer mapped to it, that layer's forward once kernelized).
KINDS = {
    "RMSNorm": ("LlamaRMSNorm", "RMSNorm"),
    "SiLU": ("SiLUActivation", "Silu"),
    "rotary_pos_emb": ("apply_rotary_pos_emb", "apply_rotary_transformers"),
}


def forward_file(module: Any) -> str:
    return str(Path(module.forward.__func__.__code__.co_filename).resolve())


def instances(model: Any, kind: str) -> list[Any]:
    """The modules of one kind; a function kind's module is found through the attention
    layers that carry it (`use_kernelized_func`), once however many layers share it."""
    marked, _ = KINDS[kind]
    found: dict[int, Any] = {}
    for module in model.modules():
        if type(module).__name__ == marked:
            found[id(module)] = module
        for func in module.__dict__.get("_kernel_funcs", {}).values():
            if getattr(type(func), "kernel_layer_name", None) == kind:
                found[id(func)] = func
    return list(found.values())


def main() -> None:
    args = json.loads(sys.argv[1])
    kinds = args.get("kinds", list(KINDS))
    repos = {"RMSNorm": args.get("repo", ACTIVATION), "SiLU": ACTIVATION, "rotary_pos_emb": ROTARY}
    folder = Path(args["model"])
    if not (folder / "config.json").exists():
        make_model(folder)

    if args.get("api") == "kerneld":
        from kerneld_client.layers import LayerRepository, Mode, register_kernel_mapping
    else:
        from kernels import LayerRepository, Mode, register_kernel_mapping  # type: ignore

    register_kernel_mapping(
        {
            kind: {
                "cpu": {
                    Mode.INFERENCE: LayerRepository(
                        repos[kind], layer_name=KINDS[kind][1], version=1
                    )
                }
            }
            for kind in kinds
        }
    )
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 12))
    reference = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = reference(ids).logits
    if args.get("api") == "kerneld":
        from kerneld_client.layers import kernelize

        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, use_kernels=True).eval()
    with torch.no_grad():
        max_err = (model(ids).logits - expected).abs().max().item()

    layers: dict[str, Any] = {}
    for kind, (_, layer) in KINDS.items():
        found = instances(model, kind)
        done = [m for m in found if m.forward.__func__.__qualname__ == f"{layer}.forward"]
        layers[kind] = {
            "count": len(found),
            "kernelized": len(done),
            "files": sorted({forward_file(m) for m in done}),
        }
    # What lazy_load_kernel and attn_implementation="org/repo" call: Transformers' get_kernel.
    from transformers.integrations.hub_kernels import get_kernel

    direct = get_kernel(repos["RMSNorm"], version=1) if args.get("direct", True) else None

    import kerneld_client
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {
                "layers": layers,
                "max_err": max_err,
                "direct_file": None if direct is None else str(Path(direct.__file__).resolve()),
                "kerneld_sources": [k.source for k in kerneld_client.loaded_kernels()],
                "kerneld_repos": sorted({k.repo_id for k in kerneld_client.loaded_kernels()}),
                "hooked": hook.installed(),
                "grpc": "grpc" in sys.modules,
            }
        )
    )


if __name__ == "__main__":
    main()
