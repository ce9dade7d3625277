"""Child process: plain `kernels` calls, as code written for `kernels` makes them.

    python -m tests.integrations._kernels_child '{"steps": [{"op": "get", "version": 1}, ...]}'

ops: `get` (kernels.get_kernel), `has` (kernels.has_kernel), `load` (kernels.load_kernel with
`lockfile`), `locked` (kernels.get_locked_kernel with `lockfile`), `kernelize` (a marked RMSNorm
mapped to `repo` at `version` or `revision`: whether its forward was swapped, or the error).
It imports nothing of the project's but kerneld_client, so a release venv can run it by path.
`kernels` is imported after torch (as a training script does) and before anything of kerneld's,
so whatever routes it through kerneld is the start-up hook. Prints one JSON object: per step
what came back (and where the module was loaded from), plus whether the hook was on, grpc
imported, the release, and any kerneld object found in `kernels`' private modules (the hook must
leave them alone).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch  # a training job's first import (and the suite forks such jobs: support/zygote.py)

# isort: split
import kernels  # the hook (if on) attaches here

REPO = "kerneld-examples/activation"


def check_ops(module: Any) -> bool:
    """The kernel computes silu(a) * b like PyTorch does."""
    x = torch.randn(4, 16)
    expected = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
    torch.testing.assert_close(module.silu_and_mul_alloc(x), expected)
    return True


def step(spec: dict[str, Any]) -> dict[str, Any]:
    op = spec["op"]
    repo = spec.get("repo", REPO)
    try:
        if op == "has":
            return {"op": op, "value": kernels.has_kernel(repo, version=spec.get("version", 1))}
        if op == "get":
            module = kernels.get_kernel(
                repo,
                version=spec.get("version", 1),
                trust_remote_code=spec.get("trust_remote_code", False),
            )
        elif op == "load":
            module = kernels.load_kernel(repo, lockfile=Path(spec["lockfile"]))
        elif op == "locked":
            module = kernels.get_locked_kernel(repo, lockfile=Path(spec["lockfile"]))
        elif op == "kernelize":
            # kernels' own layer API on a marked layer, mapped to `repo` at `version`.
            @kernels.use_kernel_forward_from_hub("RMSNorm")
            class Norm(torch.nn.Module):
                weight = torch.nn.Parameter(torch.ones(8))
                variance_epsilon = 1e-6

                def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                    return hidden_states

            selector = {"revision": spec["revision"]} if "revision" in spec else {}
            repo_entry = kernels.LayerRepository(
                repo, layer_name="RMSNorm", version=spec.get("version"), **selector
            )
            norm = Norm()
            with kernels.use_kernel_mapping({"RMSNorm": {"cpu": repo_entry}}):
                kernels.kernelize(
                    torch.nn.Sequential(norm),
                    mode=kernels.Mode.INFERENCE,
                    device="cpu",
                    use_fallback=spec.get("use_fallback", True),
                )
            # kerneld's kernelize binds the kernel's forward on the instance
            return {"op": op, "value": "kernelized", "swapped": "forward" in norm.__dict__}
        else:
            raise ValueError(op)
    except Exception as exc:
        return {
            "op": op,
            "error": type(exc).__name__,
            "file_not_found": isinstance(exc, FileNotFoundError),
            "value_error": isinstance(exc, ValueError),
            "message": str(exc),
        }
    from kerneld_client import loaded_kernels

    source = next((k.source for k in loaded_kernels() if k.module is module), None)
    registry = [
        (k.repo_info.repo_id, k.repo_info.revision)
        for k in kernels.get_loaded_kernels()
        if k.module is module and k.repo_info is not None
    ]
    return {
        "op": op,
        "file": str(Path(module.__file__).resolve()),
        "name": module.__name__,
        "kerneld_source": source,
        "registry": registry,
        "ops_ok": check_ops(module),
    }


def kerneld_in_private_modules() -> list[str]:
    """`kernels.*` module attributes whose value is kerneld's: the hook must leave none."""
    return sorted(
        f"{name}.{attr}"
        for name, module in list(sys.modules.items())
        if name.startswith("kernels.") and module is not None
        for attr, value in vars(module).items()
        if str(getattr(value, "__module__", "") or "").startswith("kerneld_client")
    )


def main() -> None:
    args = json.loads(sys.argv[1])
    results = [step(s) for s in args["steps"]]
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {
                "steps": results,
                "hooked": hook.installed(),
                "grpc": "grpc" in sys.modules,
                "version": kernels.__version__,
                "kerneld_in_private": kerneld_in_private_modules(),
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()
