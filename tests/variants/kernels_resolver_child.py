"""Child of the drift tests: judges variant names with one released `kernels`' own resolver.

Runs with `python -I` in a venv that holds only that release and what pip resolved for it (no
kerneld, no torch), so it imports nothing of the project: standard library, `kernels` and
`packaging` only. One JSON request per stdin line, one JSON answer per stdout line:

    {"names": [...], "facts": <PlatformFacts.to_dict()>}  ->
    {"accepted": [...], "accepted_reversed": [...], "rejected": {name: reason},
     "dropped": [...], "unparsable": [...]}

`accepted` is what the resolver accepts, in its order, when given the names in the request's
order (its sort is stable, so it keeps that order exactly where its key ties); `dropped` are the
parsed names its trace leaves out (0.17.2 drops arch variants on free-threaded Python < 3.15).
The first line written is `{"ready": ..., "isolation": ...}`: the release and what the venv sees.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from typing import Any


def _modules() -> tuple[Any, Any, Any]:
    try:  # 0.19 moved every module under kernels._internals
        from kernels._internals import backends, variants
    except ImportError:
        from kernels import backends, variants  # type: ignore[no-redef]
    from packaging.version import Version

    return variants, backends, Version


_CLASSES = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "rocm": "ROCm",
    "xpu": "XPU",
    "cann": "CANN",
    "metal": "Metal",
    "neuron": "Neuron",
    "tpu": "TPU",
}


def _version(version_cls: Any, text: str) -> Any:
    return version_cls(text) if text else None


def _judge(kv: Any, kb: Any, version_cls: Any, names: list[str], facts: dict[str, Any]) -> dict:
    parsed: list[tuple[str, Any]] = []
    unparsable: list[str] = []
    for name in names:
        try:
            parsed.append((name, kv.parse_variant(name)))
        except Exception:
            unparsable.append(name)
    name_of = {id(obj): name for name, obj in parsed}
    backend = facts["backend"]
    cls = getattr(kb, _CLASSES[backend["type"]])
    version = _version(version_cls, backend["version"])
    selected = cls(version=version) if version is not None else cls()
    python = tuple(int(p) for p in facts["python_version"].split(".")[:2])
    kwargs: dict[str, Any] = {
        "selected_backend": selected,
        "cpu": facts["cpu"],
        "os": facts["os"],
        "torch_version": _version(version_cls, facts["torch_version"]),
        "torch_cxx11_abi": facts["cxx11_abi"],
        "tvm_ffi_version": _version(version_cls, facts["tvm_ffi_version"]),
        "macos_version": _version(version_cls, facts["macos_version"]),
    }
    resolve = kv._resolve_variant_for_system
    if "python_version" in inspect.signature(resolve).parameters:  # 0.19
        kwargs["python_version"] = version_cls(f"{python[0]}.{python[1]}")
        kwargs["free_threaded"] = facts["free_threaded"]
        kwargs["has_mlx"] = facts.get("mlx", False)
    else:  # 0.17 asks the interpreter itself whether it is free-threaded
        unsupported = facts["free_threaded"] and python < (3, 15)
        kv._is_unsupported_free_threaded_build = lambda: unsupported

    def run(objs: list[Any]) -> tuple[list[Any], list[Any]]:
        accepted, trace = resolve(variants=objs, **kwargs)
        return accepted, trace

    accepted, trace = run([obj for _, obj in parsed])
    accepted_reversed, _ = run([obj for _, obj in reversed(parsed)])
    rejected = {
        name_of[id(d.variant)]: d.reason for d in trace if isinstance(d, kv.VariantRejected)
    }
    in_trace = {name_of[id(d.variant)] for d in trace}
    return {
        "accepted": [name_of[id(v)] for v in accepted],
        "accepted_reversed": [name_of[id(v)] for v in accepted_reversed],
        "rejected": rejected,
        "dropped": [name for name, _ in parsed if name not in in_trace],
        "unparsable": unparsable,
    }


def main() -> None:
    import logging

    logging.disable(logging.WARNING)  # 0.17.2 warns on every free-threaded resolution
    kv, kb, version_cls = _modules()
    from importlib.metadata import version

    isolation = {
        name: importlib.util.find_spec(name) is not None
        for name in ("kerneld", "kerneld_client", "torch", "transformers", "sigstore")
    }
    isolation["sys_path"] = sys.path  # type: ignore[assignment]
    print(json.dumps({"ready": version("kernels"), "isolation": isolation}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        answer = _judge(kv, kb, version_cls, request["names"], request["facts"])
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
