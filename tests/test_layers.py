"""The layers, kept by tests: inside `kerneld.server`, and the arrows docs/architecture.md draws
(issue 54).

`kerneld.server` is split by role: `plumbing/` (sockets, identity, logs, the metrics registry;
with `statuses.py`, which every layer raises through) at the bottom, `services/` on it, the front
ends (`fronts/`) on those, and the wiring (`app.py`, `main.py`, `core.py`, `reload.py`) on top.
A module imports its own layer or one below, never one above; only `app.py` imports `core.py`
(type-only imports included: a component names what it uses as a protocol of its own); a front
end imports no private name of a service; and the server's parts import each other without a
cycle (the package-level check in test_structure.py sees `kerneld.server` as one node).

The architecture doc's arrow list (the block under "Layers and the direction of imports") is
checked against the real import graph both ways: every arrow it draws is an import that exists,
and every import between two of its parts follows a path of its arrows, so a layer imports only
what the doc draws below it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.test_structure import PACKAGE, ROOT, _import_graph, _modules, cycles

SERVER = "kerneld.server"
#: The layers of `kerneld.server`, bottom first, each as the module prefixes it holds.
#: `statuses.py` stays at the top of the package while its mapping is reworked (issue 54 D6) but
#: is bottom layer: everything raises through it, and it imports only `plumbing.logs`.
SERVER_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plumbing", (f"{SERVER}.plumbing", f"{SERVER}.statuses")),
    ("services", (f"{SERVER}.services",)),
    ("fronts", (f"{SERVER}.fronts",)),
    ("wiring", (f"{SERVER}.app", f"{SERVER}.main", f"{SERVER}.core", f"{SERVER}.reload", SERVER)),
)
#: The one module that builds `Core` and hands it to the components as their host.
WIRING = {f"{SERVER}.app"}
CORE = f"{SERVER}.core"


def _owner(module: str, prefixes: Iterable[str]) -> str | None:
    """The longest of `prefixes` that `module` is or lies under; None: none."""
    found = [p for p in prefixes if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


def server_layer(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...]) -> int | None:
    """The rank of `module`'s layer (0: bottom); None outside the layers."""
    ranks = {p: rank for rank, (_, prefixes) in enumerate(layers) for p in prefixes}
    owner = _owner(module, ranks)
    return None if owner is None else ranks[owner]


def upward_imports(
    graph: Mapping[str, set[str]], layers: tuple[tuple[str, tuple[str, ...]], ...]
) -> list[str]:
    """Each import of a module from a layer above its own, as `module -> imported`."""
    found = []
    for module, imports in graph.items():
        rank = server_layer(module, layers)
        if rank is None:
            continue
        for imported in imports:
            other = server_layer(imported, layers)
            if other is not None and other > rank:
                found.append(f"{module} ({layers[rank][0]}) -> {imported} ({layers[other][0]})")
    return sorted(found)


def private_names(source: str, prefix: str) -> list[str]:
    """`from <prefix...> import _name` and `<alias>._name` of a module imported from under
    `prefix`: a private name of another part, as `line N: text`."""
    found = []
    tree = ast.parse(source)
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                else:
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name.startswith(prefix))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and ast.unparse(node.value) in aliases
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def server_parts(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The server's imports lifted to its parts: each subpackage (`fronts.rpc`, `services`, ...)
    one node, each module at the top of the package its own (statuses with plumbing)."""
    packages = {m for m in graph if m.startswith(SERVER + ".") and _is_package(m)}
    packages.add(f"{SERVER}.plumbing")

    def part(m: str) -> str:
        if m == f"{SERVER}.statuses":
            return f"{SERVER}.plumbing"
        return _owner(m, packages) or m

    lifted: dict[str, set[str]] = {}
    for module, imports in graph.items():
        if not module.startswith(SERVER + "."):
            continue
        for imported in imports:
            if imported.startswith(SERVER + ".") and part(imported) != part(module):
                lifted.setdefault(part(module), set()).add(part(imported))
    return lifted


def _is_package(module: str) -> bool:
    return (ROOT / Path(*module.split(".")) / "__init__.py").exists()


def test_only_the_wiring_imports_core() -> None:
    graph, _ = _import_graph(typing=True)
    importers = sorted(m for m, imports in graph.items() if CORE in imports)
    assert importers, "the walk sees app.py's import of core"
    assert set(importers) <= WIRING, (
        "take a host protocol of your own (what you use of the daemon) instead of Core: "
        f"{sorted(set(importers) - WIRING)}"
    )


def test_the_servers_layers_point_down() -> None:
    graph, files = _import_graph(typing=True)
    unplaced = [m for m in files if m.startswith(SERVER) and server_layer(m, SERVER_LAYERS) is None]
    assert unplaced == [], f"give these a layer in SERVER_LAYERS: {unplaced}"
    assert upward_imports(graph, SERVER_LAYERS) == [], (
        "a layer imports only its own and those below (plumbing < services < fronts < wiring): "
        "pass what is needed in through a host protocol instead"
    )


def test_fronts_use_no_private_name_of_a_service() -> None:
    offenders = {
        str(path.relative_to(ROOT)): hits
        for path in _modules(PACKAGE / "server" / "fronts")
        for hits in [private_names(path.read_text(encoding="utf-8"), f"{SERVER}.services")]
        if hits
    }
    assert offenders == {}, f"make it public in the service, or keep it there: {offenders}"


def test_no_cycle_among_the_servers_parts() -> None:
    graph, _ = _import_graph(typing=True)
    lifted = server_parts(graph)
    assert {f"{SERVER}.fronts.rpc", f"{SERVER}.services"} <= set(lifted)  # the walk sees them
    assert f"{SERVER}.plumbing" in lifted[f"{SERVER}.services"]
    assert cycles(lifted) == []


# ---- the architecture doc's arrows ---------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
HEADING = "## Layers and the direction of imports"
_PART = re.compile(r"^([\w.]+)(?:\{([\w,\s]+)\})?")


def expand(name: str) -> tuple[str, ...]:
    """`kerneld.server.{plumbing,statuses}` -> both prefixes; a plain name -> itself."""
    m = _PART.match(name.strip())
    assert m is not None and m.end() == len(name.strip()), f"not a part: {name!r}"
    base, group = m.groups()
    if group is None:
        return (base,)
    return tuple(base + g.strip() for g in group.split(","))


def drawn_arrows(doc: str) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """The arrow list of the doc's layers section: a part at the start of a line (anything after
    it in parentheses is a comment, which may go on in indented lines), then indented
    `-> part, part` lines."""
    section = doc.split(HEADING, 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    arrows: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    source: tuple[str, ...] | None = None
    for line in block.splitlines():
        text = line.strip()
        if not text:
            continue
        if text.startswith("->"):
            assert source is not None, f"an arrow before its part: {line!r}"
            targets = re.findall(r"[\w.]+(?:\{[^}]*\})?", text[2:])
            assert re.sub(r"[\w.]+(?:\{[^}]*\})?|[,\s]", "", text[2:]) == "", line
            arrows[source].update(expand(t) for t in targets)
        elif not line[0].isspace():
            source = expand(text.split("(", 1)[0].strip())
            arrows.setdefault(source, set())
    return arrows


def lift(
    graph: Mapping[str, set[str]], parts: Iterable[tuple[str, ...]]
) -> tuple[dict[tuple[str, ...], dict[tuple[str, ...], str]], list[str]]:
    """The imports of kerneld's modules between the doc's parts (one example each), and the
    modules that belong to no part. The package roots (`kerneld`, `kerneld_client`: a version,
    a re-export) are no layer."""
    by_prefix = {prefix: part for part in parts for prefix in part}
    lifted: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
    unplaced = []
    for module, imports in sorted(graph.items()):
        if not module.startswith("kerneld."):
            continue
        source = _owner(module, by_prefix)
        if source is None:
            unplaced.append(module)
            continue
        for imported in sorted(imports):
            target = _owner(imported, by_prefix)
            if target is None or by_prefix[target] == by_prefix[source]:
                continue
            lifted.setdefault(by_prefix[source], {}).setdefault(
                by_prefix[target], f"{module} -> {imported}"
            )
    return lifted, unplaced


def arrow_problems(
    arrows: Mapping[tuple[str, ...], set[tuple[str, ...]]], graph: Mapping[str, set[str]]
) -> list[str]:
    """What the drawn arrows get wrong about `graph`: an arrow with no import behind it, an
    import no path of arrows allows, a module in no part, a cycle of arrows."""
    parts = set(arrows) | {t for targets in arrows.values() for t in targets}
    real, unplaced = lift(graph, parts)
    show = ",".join
    problems = [f"{m} is in no part of the doc's list" for m in unplaced]
    for source, targets in arrows.items():
        for target in targets:
            if target not in real.get(source, {}):
                problems.append(f"drawn {show(source)} -> {show(target)}: no such import")
    for source, targets in real.items():
        seen, todo = {source}, [source]
        while todo:
            for nxt in arrows.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        for target, example in targets.items():
            if target not in seen:
                problems.append(f"{example}: no arrow path {show(source)} -> {show(target)}")
    named = {show(p): {show(t) for t in ts} for p, ts in arrows.items()}
    problems += [f"a cycle of arrows: {c}" for c in cycles(named)]
    return problems


def test_every_arrow_of_the_architecture_doc_holds() -> None:
    arrows = drawn_arrows(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(arrows) >= 10 and sum(map(len, arrows.values())) >= 10  # the block was read
    graph, _ = _import_graph()
    assert arrow_problems(arrows, graph) == []


def test_the_layer_checks_catch_what_they_are_for() -> None:
    layers = (("low", ("p.low",)), ("high", ("p.high", "p")))
    assert upward_imports({"p.low.a": {"p.high.b"}}, layers) == ["p.low.a (low) -> p.high.b (high)"]
    assert upward_imports({"p.high.b": {"p.low.a"}, "p.x": {"p.low.a"}}, layers) == []
    hidden = "from kerneld.server.services.gate import _admit\nfrom x import _y"
    assert private_names(hidden, "kerneld.server.services") == [
        "line 1: from kerneld.server.services.gate import _admit"
    ]
    reach = "from kerneld.server.services import serving\nserving._memo.clear()\nserving.go()"
    assert private_names(reach, "kerneld.server.services") == ["line 2: serving._memo"]
    assert expand("k.p.{a, b}") == ("k.p.a", "k.p.b")
    braces = drawn_arrows(f"{HEADING}\n```text\nk.a\n  -> k.{{b,c}}, k.d\n```")
    assert braces == {("k.a",): {("k.b", "k.c"), ("k.d",)}}
    block = "kerneld.a (top,\n  more)\n  -> kerneld.b\nkerneld.b\n  -> kerneld.c\nkerneld.c\n"
    doc = f"{HEADING}\n```text\n{block}```"
    arrows = drawn_arrows(doc)
    a, b, c = ("kerneld.a",), ("kerneld.b",), ("kerneld.c",)
    assert arrows == {a: {b}, b: {c}, c: set()}
    true = {"kerneld.a.x": {"kerneld.b.y", "kerneld.c"}, "kerneld.b.y": {"kerneld.c"}}
    assert arrow_problems(arrows, true) == []
    assert arrow_problems(arrows, {"kerneld.a.x": {"kerneld.c"}, "kerneld.b.y": {"kerneld.c"}}) == [
        "drawn kerneld.a -> kerneld.b: no such import"
    ]
    upward = {**true, "kerneld.c": {"kerneld.a.x"}}
    assert arrow_problems(arrows, upward) == [
        "kerneld.c -> kerneld.a.x: no arrow path kerneld.c -> kerneld.a"
    ]
    assert arrow_problems(arrows, {**true, "kerneld.d": set()}) == [
        "kerneld.d is in no part of the doc's list"
    ]
