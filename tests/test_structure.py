"""The store's boundary, kept by a test: the SQL is the `store/index/` package's, the store's
insides are the store's.

Code outside `kerneld/store/` talks to a `Store` through its methods, never through
`store.index` (the SQLite index) or `store.layout` (the on-disk layout): both stay free to change.
Inside the store, only the modules of `index/` hold SQL. Both rules are checked on the syntax
tree, so a comment or a string that mentions them does not count, and each check is shown to
catch a violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kerneld"
STORE = PACKAGE / "store"
INSIDES = ("index", "layout")
#: The modules allowed to run SQL: the index package, one module per group of tables.
SQL_MODULES = STORE / "index"


def reach_through(source: str) -> list[str]:
    """`<something>.store.index.<x>` / `store.layout...` and `x = store.index`: each as text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr in INSIDES):
            continue
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name in ("store", "_store"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def sql_calls(source: str) -> list[str]:
    """Calls of `.execute(...)`/`.executemany(...)`/`.executescript(...)`: SQL being run."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("execute", "executemany", "executescript")
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "_proto" not in p.parts)


def test_nothing_outside_the_store_reaches_into_it() -> None:
    offenders = {
        str(path.relative_to(ROOT)): hits
        for path in _modules(PACKAGE)
        if STORE not in path.parents
        for hits in [reach_through(path.read_text(encoding="utf-8"))]
        if hits
    }
    assert offenders == {}, (
        "use (or add) a Store method instead of store.index / store.layout: " + str(offenders)
    )


def test_only_the_index_module_runs_sql() -> None:
    offenders = {
        str(path.relative_to(ROOT)): hits
        for path in _modules(PACKAGE)
        if path.parent != SQL_MODULES
        for hits in [sql_calls(path.read_text(encoding="utf-8"))]
        if hits
    }
    assert offenders == {}, "move the statement into kerneld/store/index/: " + str(offenders)
    # The exemption names the modules that do run SQL (a stale path would exempt nothing).
    assert any(sql_calls(path.read_text(encoding="utf-8")) for path in _modules(SQL_MODULES))


def test_the_checks_catch_what_they_are_for() -> None:
    assert reach_through("rows = self.core.store.index.denies()")
    assert reach_through("index = store.index")
    assert reach_through("p = self._store.layout.tree_path(h)")
    assert not reach_through("store.tree_path(h); layout.root; self.index.get_tree(d)")
    assert sql_calls("conn.execute('DELETE FROM pins')")
    assert sql_calls("conn.executemany(q, rows)")
    assert not sql_calls("# conn.execute('x')\nexecute = 1")
