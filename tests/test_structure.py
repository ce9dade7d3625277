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
The layers inside `kerneld.server` (plumbing, services, fronts, the wiring) and the arrows of
docs/architecture.md are tests/test_layers.py's.

Getting a kernel has one path, `kerneld/pipeline/acquire.py`: nothing else calls the fetcher or
spells the acquire sequence's steps (the ref, the listing, publisher trust), and the pipeline
imports nothing of the daemon's server (issue 54).

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


#: The names of a whole store: the concrete class and the protocol of all its parts.
WHOLE = ("Store", "StoreHandle")


def store_annotations(source: str) -> list[int]:
    """Lines that declare a parameter, return value or attribute as a whole store (`Store`,
    `"Store"`, `kerneld.store.Store`, `StoreHandle`); calling `Store(...)` to open one is not
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
                if name in WHOLE or (isinstance(n, ast.Constant) and n.value in WHOLE):
                    lines.append(node.lineno)
    return lines


#: The modules that still take a whole store (`Store` or `StoreHandle`), each with why. Every
#: other consumer names the part it uses or a protocol of a few parts (interfaces.py: Policy,
#: Catalog, FetchTarget, ExportSource, ...), so that its signature says what it can do.
WHOLE_STORE = {
    "kerneld/server/core.py": "opens the daemon's store (open_store) and hands its parts out",
    "kerneld/ctl/common.py": "opens the store at --store for the offline commands",
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
    assert not reach_through("store.catalog.tree_path(h); layout.root; self.index.get_tree(d)")
    assert sql_calls("conn.execute('DELETE FROM pins')")
    assert sql_calls("conn.executemany(q, rows)")
    assert not sql_calls("# conn.execute('x')\nexecute = 1")
    assert store_annotations("def f(store: Store) -> None: ...") == [1]
    assert store_annotations("class A:\n    store: 'Store'\n") == [2]
    assert store_annotations("def f() -> kerneld.store.Store: ...") == [1]
    assert store_annotations("s = Store(root)\ndef f(store: FetchTarget) -> None: ...") == []
    assert store_annotations("def f(store: StoreHandle) -> None: ...") == [1]
    cls = "class Store:\n"
    assert forwarding_methods(cls + "    def f(self, x):\n        return self._a.f(x)\n")
    assert forwarding_methods(cls + "    def f(self):\n        'Doc.'\n        self.a.b()\n")
    assert forwarding_methods(cls + "    @property\n    def g(self):\n        return self._s.g\n")
    assert not forwarding_methods(cls + "    def f(self):\n        self.a.f()\n        g()\n")
    assert not forwarding_methods(cls + "    def f(self):\n        return g(self.a)\n")


def forwarding_methods(source: str) -> list[str]:
    """Methods of `Store` whose whole body (docstring aside) hands the call on to something it
    holds: `return self._part.f(...)`, `self.part.f(...)` or `return self._part.attr`."""
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not (isinstance(cls, ast.ClassDef) and cls.name == "Store"):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            body = fn.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr):
                continue
            value = body[0].value
            target = value.func if isinstance(value, ast.Call) else value
            # self.<part>.<name>: an attribute of an attribute of self.
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Attribute)
                and isinstance(target.value.value, ast.Name)
                and target.value.value.id == "self"
            ):
                found.append(f"line {fn.lineno}: {fn.name}")
    return found


def test_the_store_is_composed_not_forwarded() -> None:
    """`Store` holds its parts (``store.names``, ``store.blobs``, ...) and callers name the
    part, so the class has no method that only passes a call on (issue 54: 68 of 78 did)."""
    assert forwarding_methods((STORE / "store.py").read_text(encoding="utf-8")) == []


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


def module_imports(
    source: str, module: str, *, is_package: bool, known: set[str], typing: bool = False
) -> set[str]:
    """The modules of `known` that `module` imports anywhere (in functions too), the bodies of
    `if TYPE_CHECKING:` aside (those run only under the type checker) unless `typing`."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", None)
            skip = name == "TYPE_CHECKING" and not typing
            for child in node.orelse if skip else node.body + node.orelse:
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


def _import_graph(*, typing: bool = False) -> tuple[dict[str, set[str]], dict[str, Path]]:
    roots = {PACKAGE: "kerneld", ROOT / "client" / "kerneld_client": "kerneld_client"}
    files: dict[str, Path] = {}
    for base, name in roots.items():
        for path in _modules(base):
            parts = [name, *path.relative_to(base).with_suffix("").parts]
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    known = set(files)
    graph = {
        m: module_imports(
            p.read_text(encoding="utf-8"),
            m,
            is_package=p.name == "__init__.py",
            known=known,
            typing=typing,
        )
        for m, p in files.items()
    }
    return graph, files


def package_of(module: str, packages: set[str]) -> str:
    """The top-level part a module belongs to: `kerneld.server.fronts.hubapi.view` ->
    `kerneld.server` (a package directly under `kerneld`/`kerneld_client`), `kerneld.cli` ->
    itself."""
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


def test_no_import_cycles_in_the_daemon_type_only_imports_included() -> None:
    """A cycle through an `if TYPE_CHECKING:` import is still two modules that are one (issue
    54: the store's `state` -> `signatures` -> `published_index_writer` -> `state`). The daemon's
    modules only: the client's package `__init__` is imported for types by its own modules."""
    graph, _ = _import_graph(typing=True)
    daemon = {m: {i for i in imports if i.startswith("kerneld.")} for m, imports in graph.items()}
    assert cycles({m: i for m, i in daemon.items() if m.startswith("kerneld.")}) == []


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
    assert module_imports(typing_only, "p.a", is_package=False, known=known, typing=True) == {"p.b"}
    lifted = package_graph({"k.s.app": {"k.h.view"}, "k.h.view": {"k.s.core"}}, {"k.s", "k.h"})
    assert cycles(lifted) == [["k.h", "k.s"]]
    assert environment_reads("import os\nx = os.environ.get('A')")
    assert environment_reads("from os import getenv")
    assert not environment_reads("env = {}\nenv.get('A')  # os.environ")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: The one module that walks the acquire sequence (kerneld/pipeline/acquire.py's docstring).
ACQUIRE = "kerneld/pipeline/acquire.py"
#: The entry points of the sequence's steps: the fetcher, the ref and listing questions, the
#: publisher's admission. Only `ACQUIRE` calls them, but for the modules below, each with why.
ACQUIRE_STEPS = ("fetch_variant", "commit_for", "variant_names", "check_publisher")
SPELLS_A_STEP = {
    "kerneld/server/services/refresh.py": "re-checks served refs before their TTL is up (no tree)",
    "kerneld/server/fronts/rpc/admin_service.py": "pin and lock name a revision's commit (no tree)",
    "kerneld/server/fronts/hubapi/view.py": "refs and a remembered listing re-ask trust",
    "kerneld/store/published_index.py": "the index document's own `commit_for` (no upstream)",
    "kerneld/ctl/cmd_env.py": "`env` reads what the daemon published: the document's `commit_for`",
}


def step_calls(source: str, names: tuple[str, ...] = ACQUIRE_STEPS) -> list[str]:
    """Calls of `<anything>.<name>(...)` for each name in `names`, as `line N: name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in names
        ):
            found.append(f"line {node.lineno}: {node.func.attr}")
    return found


def test_nothing_but_acquire_walks_the_acquire_path() -> None:
    calls = {
        rel: hits
        for path in _modules(PACKAGE)
        for rel in [str(path.relative_to(ROOT))]
        if rel != ACQUIRE
        for hits in [step_calls(path.read_text(encoding="utf-8"))]
        if hits
    }
    fetches = {rel: [h for h in hits if h.endswith("fetch_variant")] for rel, hits in calls.items()}
    assert {rel: hits for rel, hits in fetches.items() if hits} == {}, (
        "only the acquire path fetches: call `Acquire.acquire` with a plan"
    )
    offenders = {rel: hits for rel, hits in calls.items() if rel not in SPELLS_A_STEP}
    assert offenders == {}, (
        "take the acquire path (`Acquire.acquire`, `admitted`, `listing`, `commit_of`) instead "
        f"of spelling its steps: {offenders}"
    )
    assert step_calls((ROOT / ACQUIRE).read_text(encoding="utf-8"))  # the names are the real ones
    stale = [rel for rel in SPELLS_A_STEP if rel not in calls]
    assert stale == [], f"no longer call a step, drop them from SPELLS_A_STEP: {stale}"


#: What an upstream answers (kerneld/upstream/base.py): the daemon asks it only in the pipeline.
#: (`list_variants` and `resolve_revision` are also names of `Serving`'s and the store's own
#: methods, so they are not counted.)
UPSTREAM_QUESTIONS = ("list_refs", "list_files", "open_file")


def test_the_daemon_asks_its_upstreams_only_through_the_pipeline() -> None:
    """A front end (the Hub endpoint's refs and file listings too) takes the acquire path, so
    its questions pass the same caches, TTLs and fetch gate as every other."""
    offenders = {
        rel: hits
        for path in _modules(PACKAGE / "server")
        for rel in [str(path.relative_to(ROOT))]
        for hits in [step_calls(path.read_text(encoding="utf-8"), UPSTREAM_QUESTIONS)]
        if hits
    }
    assert offenders == {}, f"ask through kerneld/pipeline/acquire.py: {offenders}"
    assert step_calls((ROOT / ACQUIRE).read_text(encoding="utf-8"), UPSTREAM_QUESTIONS)


def test_the_pipeline_imports_nothing_of_the_server() -> None:
    """The acquire path is below the daemon: kerneldctl runs it too, with an allow-all gate."""
    graph, _ = _import_graph()
    offenders = sorted(
        f"{m} -> {i}"
        for m, imports in graph.items()
        if m.startswith("kerneld.pipeline")
        for i in imports
        if i.startswith("kerneld.server")
    )
    assert offenders == []
    assert "kerneld.pipeline.acquire" in graph["kerneld.pipeline.prefetch"]


def test_the_acquire_checks_catch_what_they_are_for() -> None:
    assert step_calls("self._fetcher.fetch_variant(r, c, v)") == ["line 1: fetch_variant"]
    assert step_calls("x = resolver.commit_for(spec)\ny = r.variant_names(a, b)") == [
        "line 1: commit_for",
        "line 2: variant_names",
    ]
    assert step_calls("def fetch_variant(self): ...\nfetch_variant = None") == []
