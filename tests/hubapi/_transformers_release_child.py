"""Child process of a throw-away venv: a released Transformers (and the `kernels` it requires),
unmodified, loading a tiny random Llama with `use_kernels=True`.

    python _transformers_release_child.py '{"model": "<dir>", "repo": "org/name"}'

Run by path: nothing of kerneld's is importable here (the checkout is put on sys.path for the
tiny model's maker, which imports only torch and transformers). RMSNorm on CPU is mapped to the
example kernel's layer with the `kernels` API (CPU is not a device `KernelConfig` accepts).
Prints one JSON object: versions, how many RMSNorm layers there are and how many run the
kernel's forward, the files those forwards come from, and the largest difference of the logits
from PyTorch's.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch  # a training job's first import; the suite forks such jobs (tests/support/zygote.py)


def main() -> None:
    args = json.loads(sys.argv[1])
    from kernels import LayerRepository, Mode, register_kernel_mapping
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.* only
    from tests.integrations.tiny_llama import make_model

    folder = Path(args["model"])
    make_model(folder)

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
