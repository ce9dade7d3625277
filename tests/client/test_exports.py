"""The package's three lists of public names stay in step: the lazy `_EXPORTS` table (what
`kerneld_client.X` resolves), `__all__`, and the `TYPE_CHECKING` imports (what type checkers
see: a name missing there is `Any` to them, as the 16 layer names were)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import kerneld_client

INIT = Path(kerneld_client.__file__)


def _type_checking_imports() -> dict[str, str]:
    """name -> module, from the `if TYPE_CHECKING:` block of the package's __init__."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    out: dict[str, str] = {}
    for node in block.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "typing":
            out.update({alias.name: node.module for alias in node.names})
    return out


def test_exports_all_and_type_checking_names_agree() -> None:
    exports = kerneld_client._EXPORTS
    assert set(kerneld_client.__all__) == set(exports) | {"__version__"}
    assert _type_checking_imports() == exports


def test_every_export_resolves_to_its_module() -> None:
    for name, module in kerneld_client._EXPORTS.items():
        value = getattr(kerneld_client, name)
        assert value is getattr(importlib.import_module(module), name), name
