"""Child process: a Transformers user's script on a GPU node, unchanged for kerneld, on CPU.

    python -m tests.integrations._tf_models_child '{"models": "<dir>", ...}'
    (optional: "families": default all four; "use_kernels": null (Transformers' default) or a
    bool; "simulate_gpu": false skips the CPU copy of the GPU mapping; "reference": false skips
    the plain PyTorch run; "started": the parent's time.time() at the process start, to report
    `start_to_forward_s`, process start to every model loaded and its first forward done)

Creates tiny random models (tests/integrations/tiny_models.py) under `models/<family>` if missing.
Transformers' own kernel mapping (`get_kernel_mapping_transformers()`, what `use_kernels`
registers) names repos for `cuda`, `rocm`, `xpu` but never `cpu`; to run a GPU node's load on this
CPU machine, each kind's `cuda` entry is registered for `cpu` too, through the `kernels` public API
-- the repos, layer names, versions and modes are Transformers' own. Then each model is loaded once
with `use_kernels=False` (the reference) and once as the user does (`use_kernels` at its default
unless given), and the logits are compared. The references run first: under `kernels` before 0.19 a
rotary function kernel is one module shared by every model once kernelized (kerneld and 0.19
kernelize it per instance). Nothing of kerneld's is imported before the models are loaded: with
KERNELD_HOOK_KERNELS=1 the start-up hook is what routes `kernels`. Prints one JSON object."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from tests.integrations.tiny_models import FAMILIES, VOCAB, make_model  # noqa: E402

#: A kernelized layer's forward, by kind: the stand-in layers' (tests/integrations/
#: transformers_hub.py; `LigerRMSNorm` is the example activation kernel's `RMSNorm`).
KERNEL_FORWARDS = {
    "RMSNorm": "RMSNorm.forward",
    "SiLU": "Silu.forward",
    "rotary_pos_emb": "apply_rotary_transformers.forward",
}


def gpu_mapping_on_cpu() -> dict[str, Any]:
    """Transformers' mapping, each kind's `cuda` entry also registered for `cpu`."""
    from kernels import register_kernel_mapping
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    mapping = {
        kind: {"cpu": devices["cuda"]}
        for kind, devices in get_kernel_mapping_transformers().items()
        if "cuda" in devices
    }
    register_kernel_mapping(mapping)
    return mapping


def repo_of(entry: Any) -> list[str]:
    repos = entry.values() if isinstance(entry, dict) else [entry]
    return sorted({f"{r.repo_id}:{r.layer_name}" for r in repos if hasattr(r, "repo_id")})


def marked(model: Any) -> dict[str, list[Any]]:
    """Kind -> the model's modules of that kind: classes marked `use_kernel_forward_from_hub`
    and function modules attached by `use_kernelized_func` (once however many layers share it)."""
    found: dict[str, dict[int, Any]] = {}
    for module in model.modules():
        kind = getattr(type(module), "kernel_layer_name", None)
        if kind is not None:
            found.setdefault(kind, {})[id(module)] = module
        for func in module.__dict__.get("_kernel_funcs", {}).values():
            kind = getattr(type(func), "kernel_layer_name", None)
            if kind is not None:
                found.setdefault(kind, {})[id(func)] = func
    return {kind: list(mods.values()) for kind, mods in found.items()}


def describe(model: Any) -> dict[str, Any]:
    layers = {}
    for kind, modules in marked(model).items():
        forward = KERNEL_FORWARDS.get(kind)
        done = [m for m in modules if m.forward.__func__.__qualname__ == forward]
        files = {str(Path(m.forward.__func__.__code__.co_filename).resolve()) for m in done}
        layers[kind] = {"count": len(modules), "kernelized": len(done), "files": sorted(files)}
    return layers


def main() -> None:
    args = json.loads(sys.argv[1])
    root = Path(args["models"])
    families = args.get("families", list(FAMILIES))
    for family in families:
        if not (root / family / "config.json").exists():
            make_model(root / family, family)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 12))

    expected: dict[str, torch.Tensor] = {}
    if args.get("reference", True):
        for family in families:
            reference = AutoModelForCausalLM.from_pretrained(root / family, use_kernels=False)
            with torch.no_grad():
                expected[family] = reference.eval()(ids).logits

    mapped = gpu_mapping_on_cpu() if args.get("simulate_gpu", True) else {}
    kwargs = {} if args.get("use_kernels") is None else {"use_kernels": args["use_kernels"]}
    models: dict[str, Any] = {}
    for family in families:
        model = AutoModelForCausalLM.from_pretrained(root / family, **kwargs).eval()
        with torch.no_grad():
            logits = model(ids).logits
        models[family] = {
            "use_kernels": bool(model.use_kernels),
            "layers": describe(model),
            "max_err": (logits - expected[family]).abs().max().item() if expected else None,
        }
    loaded_s = time.perf_counter() - T0
    started = args.get("started")
    start_to_forward_s = None if started is None else time.time() - started

    import kernels
    import transformers

    import kerneld_client
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {
                "models": models,
                "mapped": {kind: repo_of(entry["cpu"]) for kind, entry in mapped.items()},
                "kerneld_sources": sorted({k.source for k in kerneld_client.loaded_kernels()}),
                "kerneld_repos": sorted({k.repo_id for k in kerneld_client.loaded_kernels()}),
                "hooked": hook.installed(),
                "grpc": "grpc" in sys.modules,
                "transformers": transformers.__version__,
                "kernels": kernels.__version__,
                "loaded_s": loaded_s,
                "start_to_forward_s": start_to_forward_s,
            }
        )
    )


if __name__ == "__main__":
    main()
