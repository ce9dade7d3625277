"""Hypothesis strategies shared by the fuzz tests: valid-looking documents and their mutations.

Random bytes rarely get past a parser's first check, so most strategies start from a *valid*
document (a lock file, a manifest, a tar bundle) and mutate it: a node replaced by a hostile
value, a key dropped or added, a list entry duplicated; pathological JSON spliced in (nesting
deeper than the recursion limit, integers with more digits than `int()` converts, NaN);
hostile names (`..`, absolute paths into the sandbox's sentinel directory, NUL, very long names,
lone surrogates). `raw_mutations` then damages the serialised bytes as well. Absolute paths are
only ever `OUTSIDE/...`: harnesses point them at their sandbox, never at the real system.

`FUZZ` profiles (see `fuzz_settings`): the test suite runs a bounded, derandomized number of
examples so CI is reproducible; `KERNELD_FUZZ_SCALE=20` multiplies the examples and explores
randomly (the long runs described in fuzz/README.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.fuzz.invariants import OUTSIDE

#: >1 for long exploratory runs (random instead of derandomized examples).
SCALE = float(os.environ.get("KERNELD_FUZZ_SCALE", "1"))


def fuzz_settings(examples: int, *, deadline_s: float | None = 2.0) -> settings:
    """A bounded profile: `examples` (times KERNELD_FUZZ_SCALE) examples, a per-example deadline
    as the hang detector, no example database, and derandomized in the test suite so a failure in
    CI reproduces exactly (the found bugs are kept as @example regressions anyway)."""
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None if deadline_s is None else timedelta(seconds=deadline_s),
        derandomize=SCALE <= 1,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
            HealthCheck.large_base_example,
        ],
    )


# ---- hostile scalars --------------------------------------------------------------------------

HOSTILE_PATHS = [
    "../x",
    "../../../../x",
    # From a tree being staged (store/v1/tmp/staging/<dir>/) to the sandbox's sentinel directory;
    # no deeper, so that even a regression writes only inside the sandbox.
    *("../" * depth + "outside/pwned" for depth in range(3, 6)),
    f"{OUTSIDE}/passwd",
    f"{OUTSIDE}/pwned",
    "a/../../b",
    "a/./b",
    "./a",
    "a//b",
    "a/",
    "",
    ".",
    "..",
    "a\x00b",
    "a\nb",
    "a\\..\\b",
    "..\\x",
    "x" * 300,
    "/".join(["d"] * 1200),
    "\udc80",
    "\u202e.py",
    "__pycache__/x.pyc",
    "metadata.json/x",
]

HOSTILE_STRINGS = [
    *HOSTILE_PATHS,
    " ",
    "\t",
    "²",
    "\u0661\u0662",
    "9" * 5000,
    "1e999",
    "-1",
    "NaN",
    "org/name",
    "org/../name",
    "a" * 100_000,
]

HUGE_INTS = [-1, -(2**63), 2**31, 2**32, 2**63, 2**64, 2**64 + 1, 10**400]
FLOATS = st.floats(allow_nan=True, allow_infinity=True)

hostile_text = st.sampled_from(HOSTILE_STRINGS) | st.text(max_size=40)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from(HUGE_INTS)
    | FLOATS
    | hostile_text
)

# ---- pathological JSON text -------------------------------------------------------------------

#: A JSON leaf that `json.dumps` cannot write: replaced by raw text after dumping.
SPLICE = "\x00splice\x00"


def _deep(n: int, kind: str) -> str:
    if kind == "list":
        return "[" * n + "]" * n
    return '{"a":' * n + "1" + "}" * n


PATHOLOGICAL_JSON = st.one_of(
    # Not close to the recursion limit: whether ~1000 levels fail depends on the stack depth.
    st.builds(_deep, st.sampled_from([50, 2000, 100_000]), st.sampled_from(["list", "obj"])),
    st.builds(_deep, st.just(100_000), st.just("list")),
    st.sampled_from(
        [
            "9" * 4301,
            "-" + "9" * 5000,
            "1" + "0" * 400 + ".5",
            "1e999",
            "-1e999",
            "NaN",
            "Infinity",
            "-Infinity",
            '"\\ud800"',
            '"\\u0000"',
            '"' + "x" * 70_000 + '"',
        ]
    ),
)

json_leaves = scalars | st.just(SPLICE)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=12,
)


def dump_with_splices(doc: Any, splices: list[str]) -> str:
    """`json.dumps(doc)` with each SPLICE leaf replaced by the next pathological text."""
    text = json.dumps(doc, default=str)
    marker = json.dumps(SPLICE)
    out = []
    parts = text.split(marker)
    for i, part in enumerate(parts):
        out.append(part)
        if i < len(parts) - 1:
            out.append(splices[i % len(splices)] if splices else "null")
    return "".join(out)


# ---- tree mutations of a valid document --------------------------------------------------------


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _copy(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _copy(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_copy(v) for v in doc]
    return doc


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any], *, max_mutations: int = 3) -> Any:
    """A valid document with 0..max_mutations structural mutations."""
    doc = _copy(draw(valid))
    for _ in range(draw(st.integers(0, max_mutations))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "add", "duplicate", "wrap", "splice"]))
        if not path:
            if op in ("replace", "wrap", "splice"):
                doc = {"wrap": [doc], "splice": SPLICE}.get(op) or draw(json_values)
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = draw(json_values)
        elif op == "splice":
            parent[key] = SPLICE
        elif op == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {"x": parent[key]}]))
        elif op == "delete":
            del parent[key]
        elif op == "add":
            if isinstance(parent, dict):
                parent[draw(hostile_text)] = draw(json_values)
            else:
                parent.insert(key, draw(json_values))
        elif isinstance(parent, list):
            parent.insert(key, _copy(parent[key]))
        else:
            parent[f"{key}{draw(st.sampled_from(['', ' ', '_']))}"] = _copy(parent[key])
    return doc


@st.composite
def json_document(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> bytes:
    """A mutated valid document serialised as JSON; a third of them with pathological JSON
    (deep nesting, huge numbers, NaN, ...) spliced in at a random node."""
    doc = draw(mutated(valid))
    if draw(st.integers(0, 2)) == 0:
        path = draw(st.sampled_from(_paths(doc)))
        if path:
            _get(doc, path[:-1])[path[-1]] = SPLICE
        else:
            doc = SPLICE
    splices = draw(st.lists(PATHOLOGICAL_JSON, min_size=1, max_size=2))
    return dump_with_splices(doc, splices).encode("utf-8", "surrogatepass")


@st.composite
def raw_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """Byte-level damage: flips, cuts, inserted junk, repeated slices."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        at = draw(st.integers(0, max(0, len(buf) - 1))) if buf else 0
        if op == "flip" and buf:
            buf[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif buf:
            end = draw(st.integers(at, len(buf)))
            buf[at:at] = buf[at:end]
    return bytes(buf)


def bytes_of(valid: Callable[[], st.SearchStrategy[bytes]]) -> st.SearchStrategy[bytes]:
    """Valid bytes, structurally mutated documents, raw-damaged ones, and plain noise."""
    base = valid()
    return st.one_of(
        base,
        base.flatmap(raw_mutations),
        st.binary(max_size=300),
    )


# ---- TOML text -------------------------------------------------------------------------------


def toml_string(value: str) -> str:
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{toml_string(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    return toml_string(str(value))


def toml_document(doc: dict[str, Any]) -> str:
    """Top-level scalars, then [table]s and [[array of tables]] (what kerneld.toml uses)."""
    lines: list[str] = []
    for key, value in doc.items():
        if not isinstance(value, dict) and not (
            isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
        ):
            lines.append(f"{toml_string(key)} = {toml_value(value)}")
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"[{toml_string(key)}]")
            lines += [f"{toml_string(str(k))} = {toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for table in value:
                lines.append(f"[[{toml_string(key)}]]")
                lines += [f"{toml_string(str(k))} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


#: TOML can hold neither lone surrogates nor (here) anything a str() of an object would be.
toml_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
toml_scalars = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | FLOATS
    | toml_text
    | st.sampled_from([s for s in HOSTILE_STRINGS if "\udc80" not in s and len(s) < 6000])
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(toml_text, children, max_size=3)
    ),
    max_leaves=8,
)
