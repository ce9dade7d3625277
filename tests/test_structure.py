"""The code's shape, kept by tests: the store's boundary, modules of a readable size, no
import cycles (issue 21).

Code outside `kerneld/store/` talks to a `Store` through its methods, never through
`store.index` (the SQLite index) or `store.layout` (the on-disk layout): both stay free to change.
Inside the store, only the modules of `index/` hold SQL. Both rules are checked on the syntax
tree, so a comment or a string that mentions them does not count, and each check is shown to
catch a violation.

No module passes `MAX_LINES` (generated stubs aside): a module that grows past it is doing more
than one job. No import cycle among kerneld's and the client's modules, counting imports at
module level (`TYPE_CHECKING` blocks aside): a cycle means two modules are one.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Mapping
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
    return sorted(p for p in root.rglob("*.py") if "proto" not in p.parts)


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


MAX_LINES = 600
#: Where the project's Python lives (what `git ls-files` lists, generated stubs aside).
SOURCE_DIRS = ("kerneld", "client", "tests", "bench", "examples", "scripts", "chaos", "fuzz")


def _project_python() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *(f"{d}/*.py" for d in SOURCE_DIRS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / rel for rel in listed if "_pb2" not in rel]


def test_no_module_passes_the_size_limit() -> None:
    paths = _project_python()
    assert len(paths) > 100  # the listing works
    sizes = {
        str(p.relative_to(ROOT)): n
        for p in paths
        if p.exists() and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert sizes == {}, f"split these along their seams (over {MAX_LINES} lines): {sizes}"


def module_imports(source: str, module: str, *, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports at module level (`TYPE_CHECKING` aside)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                name = getattr(test, "id", None) or getattr(test, "attr", None)
                visit(node.orelse if name == "TYPE_CHECKING" else node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in known else base)

    visit(ast.parse(source).body)
    return (found & known) - {module}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    roots = {PACKAGE: "kerneld", ROOT / "client" / "kerneld_client": "kerneld_client"}
    files: dict[str, Path] = {}
    for base, name in roots.items():
        for path in _modules(base):
            parts = [name, *path.relative_to(base).with_suffix("").parts]
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    known = set(files)
    graph = {
        m: module_imports(
            p.read_text(encoding="utf-8"), m, is_package=p.name == "__init__.py", known=known
        )
        for m, p in files.items()
    }
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the walk sees imports
    assert cycles(graph) == []


def test_the_shape_checks_catch_what_they_are_for() -> None:
    known = {"p", "p.a", "p.b"}
    assert module_imports("from p import b", "p.a", is_package=False, known=known) == {"p.b"}
    assert module_imports("from . import b", "p.a", is_package=False, known=known) == {"p.b"}
    lazy = "def f():\n    import p.b\nif TYPE_CHECKING:\n    import p.b"
    assert module_imports(lazy, "p.a", is_package=False, known=known) == set()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
