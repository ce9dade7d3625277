"""The environment-variable part of docs/configuration.md: every variable the daemon,
`kerneldctl` and the client library read, the modules that read it, and what it means.

The variables are every `KERNELD_*` string literal, every module constant named `ENV_*`, and
every literal name read through `os.environ` / `os.getenv` / `env.get(...)` in `kerneld/` and
`client/kerneld_client/` (except the service manager's own protocol variables). A variable's
description is, in order: the `#:` comment above its `ENV_*` constant; a line of a docstring
table that starts with its name (as in `kerneld_client._config`); the first docstring sentence
that names it (the reading function's first); an argparse help text that names it. A new knob
needs one of those.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scripts.reference import ROOT
from scripts.reference.markdown import UNDOCUMENTED, cell

SOURCES = (ROOT / "kerneld", ROOT / "client" / "kerneld_client")
SKIP_DIRS = {"proto", "__pycache__"}
#: Not kerneld knobs: systemd's own protocol variables (readiness, watchdog, journal), and the
#: base-directory variables user-mode paths follow (the document says so in prose).
NOT_KNOBS = {
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "JOURNAL_STREAM",
    "INVOCATION_ID",
    "HOME",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
}
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z0-9]$")
_KERNELD_NAME = re.compile(r"^KERNELD_[A-Z0-9_]*[A-Z0-9]$")


@dataclass
class EnvVar:
    name: str
    modules: set[str] = field(default_factory=set)
    description: str = ""
    overrides: list[str] = field(default_factory=list)  # "[section] key" it overrides


@dataclass
class _Source:
    module: str
    tree: ast.Module
    lines: list[str]


def _sources(roots: tuple[Path, ...]) -> list[_Source]:
    """The Python files of the packages `roots`, parsed, with their module names."""
    out = []
    for base in roots:
        for path in sorted(base.rglob("*.py")):
            if SKIP_DIRS & set(path.relative_to(base).parts):
                continue
            rel = path.relative_to(base.parent)
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            text = path.read_text(encoding="utf-8")
            out.append(_Source(module, ast.parse(text), text.splitlines()))
    return out


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, `environ`, or a mapping parameter called `env`/`environ`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in ("environ", "env")


def _literal_env_read(node: ast.AST) -> str | None:
    """The variable name of `os.environ.get("X")`, `os.getenv("X")`, `env["X"]`, ..."""
    arg: ast.expr | None = None
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        if isinstance(func, ast.Attribute) and (
            func.attr == "getenv"
            or (func.attr in ("get", "pop", "setdefault") and _is_environ(func.value))
        ):
            arg = node.args[0]
    elif isinstance(node, ast.Subscript) and _is_environ(node.value):
        arg = node.slice
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value if _ENV_NAME.match(arg.value) else None
    return None


def _comment_above(src: _Source, lineno: int) -> str:
    """`#:` comment lines directly above line `lineno` (1-based), joined."""
    out: list[str] = []
    i = lineno - 2
    while i >= 0 and src.lines[i].strip().startswith("#:"):
        out.insert(0, src.lines[i].strip()[2:].strip())
        i -= 1
    return " ".join(out)


def _docstrings(src: _Source) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                yield node, doc


def _table_row(doc: str, name: str) -> str:
    """`    NAME   text` (+ deeper-indented continuation lines) in a docstring table."""
    lines = doc.splitlines()
    pattern = re.compile(rf"^(\s*)\$?{re.escape(name)}(?:=\S*)?\s{{2,}}(\S.*)$")
    for i, line in enumerate(lines):
        if m := pattern.match(line):
            text = [m.group(2).strip()]
            column = len(line) - len(m.group(2))
            for more in lines[i + 1 :]:
                if more.strip() and len(more) - len(more.lstrip()) >= column:
                    text.append(more.strip())
                else:
                    break
            return " ".join(text)
    return ""


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`$(])")


def _sentence(text: str, name: str) -> str:
    """The first sentence of `text` that names `name` and says something besides names."""
    flat = " ".join(text.split())
    for sentence in _SENTENCE.split(flat):
        if not re.search(rf"(?<![A-Z_]){re.escape(name)}(?![A-Z0-9_])", sentence):
            continue
        words = re.findall(r"[a-z]{2,}", re.sub(r"\$?[A-Z][A-Z0-9_]+", "", sentence))
        if len(words) >= 4:
            return sentence.strip()
    return ""


def _help_texts(src: _Source) -> Iterator[str]:
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                value = kw.value
                if kw.arg in ("help", "description") and isinstance(value, ast.Constant):
                    yield str(value.value)


def _enclosing_functions(src: _Source, lineno: int) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions containing line `lineno`, innermost first."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = [
        node
        for node in ast.walk(src.tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.lineno <= lineno <= (node.end_lineno or node.lineno)
    ]
    return sorted(found, key=lambda n: -n.lineno)


def environment(roots: tuple[Path, ...] = SOURCES) -> list[EnvVar]:
    """Every environment variable the packages `roots` read, described (an empty description:
    none found)."""
    sources = _sources(roots)
    found: dict[str, EnvVar] = {}
    constants: dict[str, set[str]] = {}  # constant name -> variable names it holds
    comments: dict[str, str] = {}
    sites: dict[str, list[tuple[_Source, int]]] = {}

    def add(name: str, src: _Source, lineno: int) -> None:
        if name in NOT_KNOBS:
            return
        found.setdefault(name, EnvVar(name)).modules.add(src.module)
        sites.setdefault(name, []).append((src, lineno))

    for src in sources:
        for node in ast.walk(src.tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and (node.targets[0].id.startswith("ENV_") or _KERNELD_NAME.match(node.value.value))
                and _ENV_NAME.match(node.value.value)
            ):
                value = node.value.value
                constants.setdefault(node.targets[0].id, set()).add(value)
                if comment := _comment_above(src, node.lineno):
                    comments.setdefault(value, comment)
                add(value, src, node.lineno)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _KERNELD_NAME.match(node.value)
            ):
                add(node.value, src, node.lineno)
            elif name := _literal_env_read(node):
                add(name, src, getattr(node, "lineno", 0))
    # Uses of the constants elsewhere (`locations.ENV_STORE`) count as reads there.
    for src in sources:
        for node in ast.walk(src.tree):
            ident = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            values = constants.get(ident or "", set())
            if len(values) == 1:
                add(next(iter(values)), src, getattr(node, "lineno", 0))

    docs = [(src, node, doc) for src in sources for node, doc in _docstrings(src)]
    for name, var in found.items():
        var.description = comments.get(name, "")
        if not var.description:
            var.description = next(
                (row for _, _, doc in docs if (row := _table_row(doc, name))), ""
            )
        if not var.description:
            near: list[str] = []
            for src, lineno in sites[name]:
                for func in _enclosing_functions(src, lineno):
                    doc = ast.get_docstring(func)
                    if doc:
                        near.append(doc)
            for src, _ in sites[name]:
                near.append(ast.get_docstring(src.tree) or "")
            near += [doc for _, _, doc in docs]
            var.description = next((s for text in near if (s := _sentence(text, name))), "")
        if not var.description:
            helps = (h for src in sources for h in _help_texts(src))
            var.description = next((s for text in helps if (s := _sentence(text, name))), "")
    return sorted(found.values(), key=lambda v: (not v.name.startswith("KERNELD_"), v.name))


def render_env(variables: list[EnvVar]) -> list[str]:
    out = [
        "| variable | read in | meaning |",
        "| --- | --- | --- |",
    ]
    for var in variables:
        modules = ", ".join(f"`{m}`" for m in sorted(var.modules))
        meaning = cell(var.description) if var.description else UNDOCUMENTED
        if var.overrides:
            keys = ", ".join(f"`{k}`" for k in var.overrides)
            meaning = f"Overrides {keys} of kerneld.toml. {meaning}"
        out.append(f"| `{var.name}` | {modules} | {meaning} |")
    return out
