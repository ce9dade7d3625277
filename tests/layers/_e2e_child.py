"""Child process of test_end_to_end: kernelize the test model through the host's store.

    python -m tests.layers._e2e_child '{"version": 2, "locked": "<lockfile or null>"}'

Prints one JSON object: the report, how many kernels were really obtained, whether grpc was
imported (the warm path must not), and the largest difference to the PyTorch model.
"""

from __future__ import annotations

import copy
import json
import sys

import torch

from kerneld_client.layers import (
    LayerRepository,
    LockedLayerRepository,
    Mode,
    _repos,
    kernelize,
    kernelize_report,
    use_kernel_mapping,
)
from tests.layers.model import make_model, tokens

REPO = "kerneld-examples/activation"


def main() -> None:
    args = json.loads(sys.argv[1])
    loads: list[str] = []
    real = _repos._load_repository

    def counting(repo: _repos._Repository, backend: str | None) -> _repos.KernelSource:
        loads.append(str(repo))
        return real(repo, backend)

    _repos._load_repository = counting  # type: ignore[assignment]
    reference = make_model(blocks=6).eval()
    model = copy.deepcopy(reference)
    norm: object = LayerRepository(REPO, layer_name="RMSNorm", version=args["version"])
    if args.get("locked"):
        norm = LockedLayerRepository(REPO, lockfile=args["locked"], layer_name="RMSNorm")
    mapping = {
        "RMSNorm": {"cpu": norm},
        "SiluAndMul": {
            "cpu": LayerRepository(REPO, layer_name="SiluAndMul", version=args["version"])
        },
    }
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    x = tokens()
    with torch.no_grad():
        err = (model(x) - reference(x)).abs().max().item()
    report = kernelize_report(model)
    assert report is not None
    print(
        json.dumps(
            {
                "report": report.to_dict(),
                "loads": loads,
                "grpc": "grpc" in sys.modules,
                "max_err": err,
            }
        )
    )


if __name__ == "__main__":
    main()
