"""The code's shape, kept by tests: the store's boundary, modules of a readable size, no
import cycles (issue 21).

Code outside `kerneld/store/` talks to a `Store` through its methods, never through
`store.index` (the SQLite index) or `store.layout` (the on-disk layout): both stay free to change.
A consumer takes the narrow view of the store it uses (`kerneld/store/interfaces.py`); the few
that still take the whole `Store` are listed with why.
Inside the store, only the modules of `index/` hold SQL. Both rules are checked on the syntax
tree, so a comment or a string that mentions them does not count, and each check is shown to
catch a violation.

No module passes `MAX_LINES` (generated stubs aside): a module that grows past it is doing more
than one job. No import cycle among kerneld's and the client's modules, counting every import,
those inside functions too (`TYPE_CHECKING` blocks aside): a cycle means two modules are one, and
a lazy import only hides it. No cycle between packages either (`kerneld.server`, `kerneld.mirror`,
`kerneld_client.loading`, ...): two packages that import each other are one layer.

The environment is read in one settings module per package (`kerneld.config.environment`,
`kerneld_client._config`), and the daemon uses only the client's public modules.
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


#: The store's insides: its SQLite index, its on-disk layout, its locks and holds, its shared
#: state. Outside `kerneld/store/` code uses the package (`kerneld.store`) and its value modules.
STORE_PRIVATE = ("index", "layout", "holds", "locks", "state", "ownership")


def test_the_stores_insides_are_private_to_it() -> None:
    graph, _ = _import_graph()
    private = tuple(f"kerneld.store.{name}" for name in STORE_PRIVATE)
    offenders = sorted(
        f"{m} -> {i}"
        for m, imports in graph.items()
        if not m.startswith("kerneld.store")
        for i in imports
        if i.startswith(private)
    )
    assert offenders == [], "use what kerneld.store exports (or export it): " + str(offenders)
    assert any(i.startswith(private) for m, imports in graph.items() for i in imports)


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


def store_annotations(source: str) -> list[int]:
    """Lines that declare a parameter, return value or attribute as the concrete `Store`
    (`Store`, `"Store"`, `kerneld.store.Store`); calling `Store(...)` to open one is not
    counted."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        annotations: list[ast.expr] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            annotations += [x.annotation for x in params if x is not None and x.annotation]
            annotations += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for annotation in annotations:
            for n in ast.walk(annotation):
                name = n.id if isinstance(n, ast.Name) else getattr(n, "attr", None)
                if name == "Store" or (isinstance(n, ast.Constant) and n.value == "Store"):
                    lines.append(node.lineno)
    return lines


#: The modules that still take the whole `Store`, each with why. Every other consumer names the
#: narrow view it uses (kerneld/store/interfaces.py: FetchTarget, PrefetchTarget, Catalog, ...),
#: so that its signature says what it can do to the store.
WHOLE_STORE = {
    "kerneld/server/core.py": "opens the daemon's store and hands views of it out",
    "kerneld/server/serving.py": "the RPC handlers: refs, leases, trees, denies and generations",
    "kerneld/server/scrubber.py": "scrub, quarantine, denies, refs and holds",
    "kerneld/server/suspect.py": "reads trees and quarantines what it confirms",
    "kerneld/mirror/import_.py": "blobs, trees, refs, space and metadata checks",
}


def test_consumers_take_a_view_of_the_store_not_the_store() -> None:
    offenders = {
        rel: hits
        for path in _modules(PACKAGE)
        if STORE not in path.parents
        for rel in [str(path.relative_to(ROOT))]
        if rel not in WHOLE_STORE
        for hits in [store_annotations(path.read_text(encoding="utf-8"))]
        if hits
    }
    assert offenders == {}, (
        "take the narrowest view in kerneld/store/interfaces.py (or add one) instead of the "
        f"concrete Store: {offenders}"
    )
    # Each exemption is still needed (a module that moved to a view leaves the list).
    stale = [rel for rel in WHOLE_STORE if not store_annotations((ROOT / rel).read_text())]
    assert stale == [], f"no longer take the whole Store, drop them from WHOLE_STORE: {stale}"


def test_the_checks_catch_what_they_are_for() -> None:
    assert reach_through("rows = self.core.store.index.denies()")
    assert reach_through("index = store.index")
    assert reach_through("p = self._store.layout.tree_path(h)")
    assert not reach_through("store.tree_path(h); layout.root; self.index.get_tree(d)")
    assert sql_calls("conn.execute('DELETE FROM pins')")
    assert sql_calls("conn.executemany(q, rows)")
    assert not sql_calls("# conn.execute('x')\nexecute = 1")
    assert store_annotations("def f(store: Store) -> None: ...") == [1]
    assert store_annotations("class A:\n    store: 'Store'\n") == [2]
    assert store_annotations("def f() -> kerneld.store.Store: ...") == [1]
    assert store_annotations("s = Store(root)\ndef f(store: FetchTarget) -> None: ...") == []


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
    """The modules of `known` that `module` imports anywhere (in functions too), the bodies of
    `if TYPE_CHECKING:` aside (those run only under the type checker)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", None)
            for child in node.orelse if name == "TYPE_CHECKING" else node.body + node.orelse:
                visit(child)
            visit(node.test)
            return
        if isinstance(node, ast.Import):
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
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
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


def _import_graph() -> tuple[dict[str, set[str]], dict[str, Path]]:
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
    return graph, files


def package_of(module: str, packages: set[str]) -> str:
    """The top-level part a module belongs to: `kerneld.server.hubapi.view` -> `kerneld.server`
    (a package directly under `kerneld`/`kerneld_client`), `kerneld.cli` -> itself."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    return top if top in packages else module


def package_graph(graph: Mapping[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """Module imports lifted to the top-level packages (an import within one package drops)."""
    lifted: dict[str, set[str]] = {}
    for module, imports in graph.items():
        source = package_of(module, packages)
        for imported in imports:
            target = package_of(imported, packages)
            # A package's own __init__ (`kerneld`) is the root, not a layer.
            if target != source and target not in ("kerneld", "kerneld_client"):
                lifted.setdefault(source, set()).add(target)
    return lifted


def test_no_import_cycles() -> None:
    graph, files = _import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the walk sees imports
    assert cycles(graph) == []
    packages = {m for m, p in files.items() if p.name == "__init__.py" and m.count(".") == 1}
    assert {"kerneld.server", "kerneld.mirror", "kerneld_client.loading"} <= packages
    assert cycles(package_graph(graph, packages)) == []


#: Where the environment may be read: one settings module per package. The `.pth` start-up
#: gate is not Python under the package. `publish/checkout.py` copies the environment into the
#: `git` it runs (it reads no variable).
#: The client's warm fast path reads its few variables in `_loads.setting` (by `_config`'s names,
#: checked in tests/client/test_warm_fast.py): importing `_config` would cost every warm load
#: 0.2 ms of its 2 ms budget (issue 56).
SETTINGS_MODULES = {
    "kerneld/config/environment.py",
    "client/kerneld_client/_config.py",
    "client/kerneld_client/_loads.py",
}
PASSES_ENVIRONMENT_ON = {"kerneld/publish/checkout.py"}


def environment_reads(source: str) -> list[str]:
    """`os.environ`, `os.getenv`, `environ[...]`/`environ.get(...)`: each as text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"line {node.lineno}: from os import {a.name}"
                for a in node.names
                if a.name in ("environ", "getenv")
            ]
    return found


def test_the_environment_is_read_in_one_settings_module_per_package() -> None:
    offenders = {}
    for base in (PACKAGE, ROOT / "client" / "kerneld_client"):
        for path in _modules(base):
            rel = str(path.relative_to(ROOT))
            if rel in SETTINGS_MODULES | PASSES_ENVIRONMENT_ON:
                continue
            if hits := environment_reads(path.read_text(encoding="utf-8")):
                offenders[rel] = hits
    assert offenders == {}, "read it in the package's settings module: " + str(offenders)
    for rel in SETTINGS_MODULES:
        assert environment_reads((ROOT / rel).read_text(encoding="utf-8")), rel


def test_kerneldctl_talks_to_the_daemon_never_through_its_code() -> None:
    """kerneldctl reaches a running daemon over its sockets; it shares the pipeline and the store
    with it, never `kerneld.server` (the daemon's own process)."""
    graph, _ = _import_graph()
    offenders = sorted(
        f"{m} -> {i}"
        for m, imports in graph.items()
        if m.startswith("kerneld.ctl")
        for i in imports
        if i.startswith("kerneld.server")
    )
    assert offenders == []


def test_the_daemon_uses_only_the_clients_public_modules() -> None:
    graph, _ = _import_graph()
    private = {
        f"{m} -> {i}"
        for m, imports in graph.items()
        if m.startswith("kerneld.")
        for i in imports
        if i.startswith("kerneld_client.") and any(p.startswith("_") for p in i.split(".")[1:])
    }
    assert private == set(), "make it public in the client, or keep it on the client side"


def test_the_shape_checks_catch_what_they_are_for() -> None:
    known = {"p", "p.a", "p.b"}
    assert module_imports("from p import b", "p.a", is_package=False, known=known) == {"p.b"}
    assert module_imports("from . import b", "p.a", is_package=False, known=known) == {"p.b"}
    lazy = "def f():\n    import p.b"
    assert module_imports(lazy, "p.a", is_package=False, known=known) == {"p.b"}
    typing_only = "if TYPE_CHECKING:\n    import p.b\nelse:\n    x = 1"
    assert module_imports(typing_only, "p.a", is_package=False, known=known) == set()
    lifted = package_graph({"k.s.app": {"k.h.view"}, "k.h.view": {"k.s.core"}}, {"k.s", "k.h"})
    assert cycles(lifted) == [["k.h", "k.s"]]
    assert environment_reads("import os\nx = os.environ.get('A')")
    assert environment_reads("from os import getenv")
    assert not environment_reads("env = {}\nenv.get('A')  # os.environ")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
