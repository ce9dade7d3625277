"""Child process: plain `kernels` calls, as code written for `kernels` makes them.

    python -m tests.integrations._kernels_child '{"steps": [{"op": "get", "version": 1}, ...]}'

ops: `get` (kernels.get_kernel), `has` (kernels.has_kernel), `load` (kernels.load_kernel with
`lockfile`), `locked` (kernels.get_locked_kernel with `lockfile`). `kernels` is imported first,
before anything of kerneld's, so whatever routes it through kerneld is the start-up hook. Prints
one JSON object: per step what came back (and where the module was loaded from), plus whether
the hook was on and grpc imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import kernels  # first: the hook (if on) attaches here
import torch

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

            repo_entry = kernels.LayerRepository(
                repo, layer_name="RMSNorm", version=spec["version"]
            )
            with kernels.use_kernel_mapping({"RMSNorm": {"cpu": repo_entry}}):
                kernels.kernelize(
                    torch.nn.Sequential(Norm()), mode=kernels.Mode.INFERENCE, device="cpu"
                )
            return {"op": op, "value": "kernelized"}
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


def main() -> None:
    args = json.loads(sys.argv[1])
    results = [step(s) for s in args["steps"]]
    from kerneld_client.integrations import kernels as hook

    print(
        json.dumps(
            {"steps": results, "hooked": hook.installed(), "grpc": "grpc" in sys.modules},
            default=str,
        )
    )


if __name__ == "__main__":
    main()
