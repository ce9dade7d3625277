"""pytest plugin: every public name of the `kernels` package, wherever the suite can reach it,
answered by `kerneld_client`.

Loaded with `-p api_as_kernels` when the suite runs in the "api" configuration (start-up hook
off). Before any test module is imported, `kerneld_client.integrations.kernels.install()` binds
`kernels.__all__` on the package, as the hook does; then every `kernels` module is imported and
each public name is rebound to its kerneld_client namesake (the hook's table,
`_kernels_names.SERVED`) on every submodule that holds it too, which the hook never does: a test
that imports `install_kernel` from `kernels.install` (0.19: `kernels._internals.install`) or
`LoadedKernel` from `kernels.importer` gets kerneld's, as one that imports it from `kernels`
does. No `kernels` code stays live behind a public name. `kernels`' private names
(`_loaded_kernels`, `_KERNEL_MAPPING`, `resolve_version_spec_as_ref`, ...) stay its own: a test
that uses one is testing `kernels`, and where that makes it differ the compatibility page says
so.

After collection, every public name the suite's files reach (`from kernels[.x] import NAME`,
`kernels.NAME`, read from their source) is resolved as the tests see it, and the verdict is
written as JSON to $KERNELD_API_BINDING_REPORT: name -> the module of the object it resolves to.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any


def _public() -> list[str]:
    import kernels

    return [n for n in kernels.__all__ if n != "__version__"]


def _kernels_modules() -> list[Any]:
    """Every importable module of the `kernels` package (the CLI's included)."""
    import kernels

    for info in pkgutil.walk_packages(kernels.__path__, "kernels."):
        try:
            importlib.import_module(info.name)
        except Exception:  # a module needing an optional dependency this venv lacks
            continue
    return [m for n, m in sorted(sys.modules.items()) if n.split(".")[0] == "kernels" and m]


def pytest_configure(config: Any) -> None:
    from kerneld_client.integrations import _kernels_names
    from kerneld_client.integrations import kernels as kernels_hook

    # The public way to serve `kernels` (what the start-up hook calls): binds `kernels.__all__`
    # on the package and tells kerneld_client it serves `kernels` (its loggers, its errors).
    if not kernels_hook.install():
        raise RuntimeError("kerneld_client.integrations.kernels.install() refused this release")
    names = _public()
    served = {name: _kernels_names.implementation(name) for name in names}
    for module in _kernels_modules():
        for name, value in served.items():
            if name in vars(module):
                setattr(module, name, value)


def _reached(files: list[Path]) -> set[tuple[str, str]]:
    """(module, name) for every `from kernels... import name` and `kernels.name` in `files`."""
    public = set(_public())
    reached: set[tuple[str, str]] = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kernels":
                reached.update((node.module or "", a.name) for a in node.names if a.name in public)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "kernels"
                and node.attr in public
            ):
                reached.add(("kernels", node.attr))
    return reached


def pytest_collection_finish(session: Any) -> None:
    target = os.environ.get("KERNELD_API_BINDING_REPORT")
    if not target:
        return
    files = sorted({Path(str(item.path)) for item in session.items})
    files += sorted(Path(str(session.config.rootpath)).glob("tests/conftest.py"))
    report: dict[str, str] = {}
    for module_name, name in sorted(_reached(files)):
        value = getattr(importlib.import_module(module_name), name)
        report[f"{module_name}.{name}"] = str(getattr(value, "__module__", type(value).__module__))
    Path(target).write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
