"""The Hub endpoint's one route table (`ROUTES`, kerneld/server/fronts/hubapi/server.py): the routes
docs/hub-api.md lists are exactly the table's, and a request's path is matched, and labelled for
the metrics, by the same table entry. (The routes answering through a real daemon:
tests/hubapi/test_endpoint.py.)"""

from __future__ import annotations

import re

import pytest

from kerneld.server.fronts.hubapi.server import OTHER, READ, ROUTES, route_label
from tests.support.daemon import REPO_ROOT

DOC = REPO_ROOT / "docs" / "hub-api.md"


def documented_routes() -> set[tuple[frozenset[str], str]]:
    """(methods, path) of each row of the route table under "What it serves"."""
    text = DOC.read_text(encoding="utf-8").split("## What it serves", 1)[1]
    table = text.split("| route | answer |", 1)[1].split("\n\n", 1)[0]
    rows: set[tuple[frozenset[str], str]] = set()
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        words = " ".join(re.findall(r"`([^`]*)`", line.split(" | ", 1)[0])).split()
        methods = frozenset(w for w in words if w.isalpha() and w.isupper())
        (path,) = [w for w in words if w.startswith("/")]
        rows.add((methods, path))
    return rows


def test_every_documented_route_is_a_table_entry_and_every_entry_is_documented() -> None:
    documented = documented_routes()
    table = {(route.methods, route.path) for route in ROUTES}
    assert len(documented) == 6, documented
    assert documented - table == set(), "documented but not in ROUTES"
    assert table - documented == set(), "in ROUTES but not in docs/hub-api.md"


def test_labels_are_unique_and_one_per_route() -> None:
    labels = [route.label for route in ROUTES]
    assert len(set(labels)) == len(labels) and OTHER not in labels


@pytest.mark.parametrize(
    ("path", "label", "params"),
    [
        ("/api/kernels/org/name", "info", {"org": "org", "name": "name"}),
        (
            "/api/kernels/org/name/revision/refs%2Fpr%2F1",
            "info",
            {"org": "org", "name": "name", "rev": "refs%2Fpr%2F1"},
        ),
        (
            "/api/kernels/org/name/revision/a/b",
            "info",
            {"org": "org", "name": "name", "rev": "a/b"},
        ),
        ("/api/kernels/org/name/refs", "refs", {"org": "org", "name": "name"}),
        ("/api/kernels/o/n/tree/main", "tree", {"org": "o", "name": "n", "rev": "main"}),
        (
            "/api/kernels/o/n/tree/main/build/x",
            "tree",
            {"org": "o", "name": "n", "rev": "main", "path": "build/x"},
        ),
        (
            "/api/kernels/o/n/paths-info/v1/x",
            "paths_info",
            {"org": "o", "name": "n", "rev": "v1/x"},
        ),
        (
            "/kernels/o/n/resolve/main/build/v/a.so",
            "file",
            {"org": "o", "name": "n", "rev": "main", "path": "build/v/a.so"},
        ),
        ("/api/organizations/org/overview", "org_overview", {"org": "org"}),
        ("/api/organizations/org/members", OTHER, None),
        ("/api/kernels/org/name/", OTHER, None),
        ("/api/kernels/org/name/revision", OTHER, None),
        ("/api/kernels/org/name/tree", OTHER, None),
        ("/kernels/o/n/resolve/main", OTHER, None),
        ("/api/models/org/name", OTHER, None),
    ],
)
def test_a_path_is_matched_and_labelled_by_one_entry(
    path: str, label: str, params: dict[str, str] | None
) -> None:
    matched = [(r, m) for r in ROUTES if (m := r.pattern.fullmatch(path))]
    assert route_label(path) == label
    if params is None:
        assert matched == []
        return
    ((route, match),) = matched
    assert route.label == label
    assert {k: v for k, v in match.groupdict().items() if v is not None} == params


def test_only_paths_info_is_a_post() -> None:
    assert {r.label for r in ROUTES if r.methods != READ} == {"paths_info"}
