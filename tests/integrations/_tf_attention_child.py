"""Child process: a Transformers user asking for an attention kernel from the Hub, on CPU.

    python -m tests.integrations._tf_attention_child '{"model": "<dir>", "impls": [...]}'
    (optional: "set": implementations to switch to with `set_attn_implementation` on a model
    loaded with SDPA; "generate": false skips generate())

Creates the tiny random Llama (tests/integrations/tiny_llama.py) in `model` if missing. The
reference is the same model with `attn_implementation="sdpa"`: a left-padded batch's logits
(padding positions left out) and greedy generate() with the cache. For each implementation
asked for (`"org/repo"`, `"org/repo@rev"`, `"org/repo:fn"`, `"flash_attention_2"`) the model is
loaded with it and compared; a load that fails is reported with its exception type and message.
Nothing of kerneld's is imported before the models are loaded: with KERNELD_HOOK_KERNELS=1 the
start-up hook is what routes `kernels`. Prints one JSON object."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from tests.integrations.tiny_llama import make_model


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts, the second left-padded by three tokens."""
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (2, 10))
    mask = torch.ones_like(ids)
    ids[1, :3] = 0
    mask[1, :3] = 0
    return ids, mask


def _run(model: Any, ids: torch.Tensor, mask: torch.Tensor, generate: bool) -> dict[str, Any]:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        out: dict[str, Any] = {"logits": logits}
        if generate:
            out["generated"] = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False
            ).tolist()
    return out


def _compare(got: dict[str, Any], ref: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
    seen = mask.bool()
    err = (got["logits"] - ref["logits"])[seen].abs().max().item()
    return {
        "max_err": err,
        "generate_equal": got.get("generated") == ref.get("generated"),
        "generated": got.get("generated"),
    }


def _attention_file(model: Any) -> str | None:
    """Where the attention the model now runs comes from: the kernel's `flash_attn_varlen_func`
    when Transformers registered its own flash wrapper around the kernel, else the function it
    registered (a kernel's `flash_attn_forward`)."""
    from transformers import modeling_flash_attention_utils as fa
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impl = model.config._attn_implementation
    fn = ALL_ATTENTION_FUNCTIONS.get(impl)
    if fn is not None and fn.__module__.startswith("transformers.") and fa._flash_varlen_fn:
        fn = fa._flash_varlen_fn
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else None


def main() -> None:
    args = json.loads(sys.argv[1])
    folder = Path(args["model"])
    if not (folder / "config.json").exists():
        make_model(folder)
    generate = args.get("generate", True)
    ids, mask = _inputs()
    reference = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    ref = _run(reference, ids, mask, generate)
    results: dict[str, Any] = {}
    for impl in args.get("impls", []):
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=impl).eval()
        except Exception as exc:
            results[impl] = {"error": [type(exc).__name__, str(exc), isinstance(exc, ValueError)]}
            continue
        results[impl] = {
            **_compare(_run(model, ids, mask, generate), ref, mask),
            "attn_implementation": model.config._attn_implementation,
            "file": _attention_file(model),
        }
    switched: dict[str, Any] = {}
    for impl in args.get("set", []):
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        try:
            model.set_attn_implementation(impl)
        except Exception as exc:
            switched[impl] = {"error": [type(exc).__name__, str(exc)]}
            continue
        switched[impl] = {
            **_compare(_run(model, ids, mask, generate), ref, mask),
            "attn_implementation": model.config._attn_implementation,
            "file": _attention_file(model),
        }

    import kernels
    import transformers

    import kerneld_client
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {
                "results": results,
                "set": switched,
                "reference_generated": ref.get("generated"),
                "kerneld_sources": sorted({k.source for k in kerneld_client.loaded_kernels()}),
                "kerneld_repos": sorted({k.repo_id for k in kerneld_client.loaded_kernels()}),
                "kerneld_paths": sorted({str(k.path) for k in kerneld_client.loaded_kernels()}),
                "hooked": hook.installed(),
                "grpc": "grpc" in sys.modules,
                "transformers": transformers.__version__,
                "kernels": kernels.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
