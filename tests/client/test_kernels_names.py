"""Every public name of the `kernels` package (the version in the dev extra) exists in
`kerneld_client` with a compatible signature, or that release's table in
docs/kernels-compatibility.md lists how it differs and why (the same check for every release the
hook serves, each in its own clean venv: tests/integrations/test_kernels_releases.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import kerneld_client

kernels = pytest.importorskip("kernels")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kernels-compatibility.md"
EMPTY = inspect.Parameter.empty
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def documented(section: str) -> set[str]:
    """Names in the first column of the table under `## <section>`."""
    text = PAGE.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("name", "---"):
            names.update(re.findall(r"`([A-Za-z_]+)`", cells[0]))
    return names


def incompatibilities(theirs: Any, ours: Any) -> list[str]:
    """How calling `ours` as `theirs` is called could fail."""
    mine, other = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
    problems: list[str] = []
    for name, param in other.items():
        if param.kind in VARIADIC:
            if not any(p.kind is param.kind for p in mine.values()):
                problems.append(f"no {param.kind.description} parameter")
            continue
        own = mine.get(name)
        if own is None:
            problems.append(f"no parameter {name!r}")
        elif own.kind is not param.kind:
            problems.append(f"{name!r} is {own.kind.description}, not {param.kind.description}")
        elif param.default is not EMPTY and own.default != param.default:
            problems.append(f"{name!r} defaults to {own.default!r}, not {param.default!r}")
    for name, own in mine.items():
        if name not in other and own.default is EMPTY and own.kind not in VARIADIC:
            problems.append(f"{name!r} is required here only")
    return problems


def test_every_kernels_name_is_provided_or_documented() -> None:
    differing = documented(f"kernels {kernels.__version__}")
    theirs = set(kernels.__all__)
    ours = set(kerneld_client.__all__)
    assert theirs - ours == set(), "provide every public name of kernels"
    assert differing <= theirs, f"the kernels {kernels.__version__} table names unknown names"
    problems = {}
    for name in sorted(theirs - differing - {"__version__"}):
        found = incompatibilities(getattr(kernels, name), getattr(kerneld_client, name))
        if found:
            problems[name] = found
    assert not problems, f"signatures incompatible with kernels {kernels.__version__}: {problems}"


def test_the_check_catches_an_incompatible_signature() -> None:
    def theirs(repo_id: str, *, version: int | None = None, backend: str | None = None) -> None:
        pass

    def ours(repo_id: str, version: int | None = None, *, policy: str, backend: str = "x") -> None:
        pass

    assert incompatibilities(theirs, ours) == [
        "'version' is positional or keyword, not keyword-only",
        "'backend' defaults to 'x', not None",
        "'policy' is required here only",
    ]
