"""The job side of tests/example_kernels/test_cuda_torch.py, run by path in the venv holding the
registry's CUDA torch (scripts/cuda-torch-venv) against a real kerneld serving activation-cuda.

    python cuda_torch_probe.py '{"mode": "facts"|"resolve"|"kernelize", ...}'

Prints one JSON object (its last stdout line). Imports torch, kerneld_client and the
model of examples/gpu_probe.py (the standard library at import).
`resolve` takes `{"inject": "api", "facts": {...}}` to pin facts with set_platform_facts();
`KERNELD_PLATFORM_JSON` in the environment injects them the other way.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # run by path: the checkout, after the venv, for examples/ only
from examples.gpu_probe import REPO_ID, REVISION, cuda_mapped_model  # noqa: E402


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def torch_facts() -> dict[str, Any]:
    """What torch itself says, to compare kerneld's facts against."""
    import torch

    out: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
        "is_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "file": torch.__file__,
    }
    try:
        torch.cuda.init()
    except Exception as e:  # no driver: torch says what is missing
        out["init_error"] = _error(e)
    return out


def facts() -> dict[str, Any]:
    from kerneld_client.platform import current_platform, detect_raw

    platform = current_platform()
    return {
        "torch": torch_facts(),
        "detected": detect_raw(),
        "facts": platform.facts.to_dict(),
        "fingerprint": platform.key,
    }


def ranking() -> dict[str, Any]:
    """The daemon's ranking for this process's facts (ListVariants over its socket) beside the
    client's own rules on the same names, and the device check for the first accepted one."""
    from kerneld_client import _rpc, locations
    from kerneld_client.loading.context import parse_request
    from kerneld_client.platform import current_platform
    from kerneld_client.variants import decide

    platform = current_platform()
    request = parse_request(REPO_ID, None, REVISION)
    commit, decisions = _rpc.list_variants(locations.default_socket(), request, platform.facts)
    local = decide([d.variant for d in decisions], platform.facts)
    return {
        "commit": commit,
        "facts": platform.facts.to_dict(),
        "daemon": [[d.variant, d.accepted, d.rank, d.reason] for d in decisions],
        "client": [[d.variant, d.accepted, d.rank, d.reason] for d in local],
    }


def load() -> dict[str, Any]:
    """get_kernel twice: `policy="error"` for the exact error, then with a fallback object (what
    a job passes) to see what it gets and which warnings it is shown."""
    import torch

    import kerneld_client

    out: dict[str, Any] = {}
    try:
        kernel = kerneld_client.get_kernel(REPO_ID, revision=REVISION, policy="error")
        out["imported"] = kernel.__name__
        out["ops"] = sorted(n for n in ("silu_and_mul", "rms_norm") if hasattr(kernel, n))
        try:  # the op on CPU tensors: the library registers CUDA implementations only
            kernel.silu_and_mul_alloc(torch.randn(2, 8))
            out["cpu_call"] = "ran"
        except Exception as e:
            out["cpu_call"] = _error(e).splitlines()[0]
        try:  # a CUDA tensor for it: torch needs the driver
            torch.randn(2, 8, device="cuda")
            out["cuda_tensor"] = "made"
        except Exception as e:
            out["cuda_tensor"] = _error(e)
    except Exception as e:
        out["import_error"] = _error(e)
    fallback = object()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = kerneld_client.get_kernel(REPO_ID, revision=REVISION, fallback=fallback)
    out["fallback_returned"] = got is fallback
    out["warnings"] = [[w.category.__name__, str(w.message)] for w in caught]
    return out


def resolve(args: dict[str, Any]) -> dict[str, Any]:
    if args.get("inject") == "api":
        from kerneld_client.platform import facts_from_json, set_platform_facts

        set_platform_facts(facts_from_json(json.dumps(args["facts"])))
    return {**ranking(), **load()}


def kernelize(device: str | None) -> dict[str, Any]:
    """This process's real facts: a model whose RMSNorm and SiluAndMul map to the CUDA kernel
    (for `cuda` only), on the CPU, kernelized with the device inferred from its parameters
    (`device` None, what a job does) or for `device`; then run on its CPU input."""
    import torch

    import kerneld_client

    model, mapping, x = cuda_mapped_model()
    with torch.no_grad():
        expected = model(x)
    out: dict[str, Any] = {"cuda_available": torch.cuda.is_available()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with kerneld_client.use_kernel_mapping(mapping, inherit_mapping=False):
            kerneld_client.kernelize(model, mode=kerneld_client.Mode.INFERENCE, device=device)
        report = kerneld_client.kernelize_report(model)
        try:
            with torch.no_grad():
                out["output_unchanged"] = bool(torch.equal(model(x), expected))
        except Exception as e:
            out["forward_error"] = _error(e).splitlines()[0]
    layers = [] if report is None else list(report)
    out["device"] = None if report is None else str(report.device)
    out["kernelized"] = {r.name: r.variant for r in layers if r.kernelized}
    out["kept"] = {r.name: [r.status.value, r.reason] for r in layers if not r.kernelized}
    out["warnings"] = [[w.category.__name__, str(w.message)] for w in caught]
    return out


def main() -> int:
    args: dict[str, Any] = json.loads(sys.argv[1])
    mode = args["mode"]
    if mode == "facts":
        result = facts()
    elif mode == "resolve":
        result = resolve(args)
    elif mode == "kernelize":
        result = kernelize(args.get("device"))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
