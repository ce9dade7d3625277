"""Child process, run by a release venv's python with the hook off: every public name of the
installed `kernels` (its `__all__`) and its `kerneld_client` namesake, described the same way
(kind, parameters with kind and default, dataclass or not, enum members, public attributes), as
one JSON object: {"version": ..., "names": {name: {"kernels": ..., "kerneld": ...}}}."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
from typing import Any

import kernels

import kerneld_client


def _params(obj: Any) -> list[list[Any]] | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [
        [
            p.name,
            p.kind.name,
            None if p.default is inspect.Parameter.empty else repr(p.default),
        ]
        for p in sig.parameters.values()
    ]


def describe(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {"kind": "missing"}
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return {"kind": "enum", "members": sorted(obj.__members__)}
    if inspect.isclass(obj):
        public = sorted(n for n in dir(obj) if not n.startswith("_"))
        return {
            "kind": "class",
            "params": _params(obj),
            "dataclass": dataclasses.is_dataclass(obj),
            "frozen": bool(dataclasses.is_dataclass(obj) and obj.__dataclass_params__.frozen),  # type: ignore[attr-defined]
            "attributes": public,
        }
    if callable(obj):
        return {"kind": "function", "params": _params(obj)}
    return {"kind": type(obj).__name__}


def main() -> None:
    names = [n for n in kernels.__all__ if n != "__version__"]
    out = {
        name: {
            "kernels": describe(getattr(kernels, name)),
            "kerneld": describe(getattr(kerneld_client, name, None)),
        }
        for name in names
    }
    print(json.dumps({"version": kernels.__version__, "names": out}))


if __name__ == "__main__":
    main()
