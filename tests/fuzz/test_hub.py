"""Hub API answers (tree listings with hostile paths, sizes and types) through HubUpstream
(huggingface_hub underneath) and a real fetch into a store: UpstreamError / StoreError only,
sane file entries, nothing written outside the store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import builders as b
from tests.fuzz import harnesses
from tests.fuzz import invariants as inv
from tests.fuzz.strategies import (
    HOSTILE_PATHS,
    HUGE_INTS,
    fuzz_settings,
    json_document,
    json_values,
    raw_mutations,
)

VARIANT = "torch-universal"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harnesses.HubHarness]:
    h = harnesses.HubHarness(tmp_path_factory.mktemp("fuzz-hub"))
    yield h
    h.close()


hostile_entries = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["file", "file", "directory", "symlink", 5]),
        "path": st.sampled_from(HOSTILE_PATHS).map(lambda p: f"build/{VARIANT}/{p}")
        | st.sampled_from([*HOSTILE_PATHS, "build", f"build/{VARIANT}", "other/x"]),
        "oid": st.sampled_from(["0" * 40, "g" * 40, "", "A" * 40]) | json_values,
        "size": st.sampled_from(HUGE_INTS) | json_values,
    },
    optional={
        "lfs": st.fixed_dictionaries(
            {},
            optional={
                "oid": st.sampled_from(["0" * 64, "x", ""]) | json_values,
                "size": st.sampled_from(HUGE_INTS) | json_values,
                "pointerSize": json_values,
            },
        )
        | json_values
    },
)


@st.composite
def listings(draw: st.DrawFn) -> tuple[bytes, dict[str, bytes]]:
    """A real listing of a small variant, then hostile entries and structural mutations."""
    files = b.variant_files(
        draw(
            st.dictionaries(
                st.sampled_from(["_ops.py", "a/b.py", "lib/k.so"]),
                st.binary(max_size=24),
                max_size=2,
            )
        )
    )
    lfs = draw(st.lists(st.sampled_from(sorted(files)), max_size=2))
    entries: list[Any] = json.loads(b.tree_listing(files, VARIANT, lfs=lfs))
    for _ in range(draw(st.integers(0, 2))):
        entries.insert(draw(st.integers(0, len(entries))), draw(hostile_entries))
    raw = (
        draw(json_document(st.just(entries)))
        if draw(st.booleans())
        else json.dumps(entries).encode()
    )
    if draw(st.integers(0, 5)) == 0:
        raw = draw(raw_mutations(raw))
    return raw, files


variant_names = st.lists(
    st.sampled_from([VARIANT, "torch213-cxx11-cpu-x86_64-linux"])
    | st.sampled_from(HOSTILE_PATHS)
    | st.sampled_from(["a/b", "../..", ""]),
    max_size=3,
)


@st.composite
def variant_listings(draw: st.DrawFn) -> bytes:
    names = draw(variant_names)
    doc = [
        {
            "type": "directory",
            "oid": "0" * 40,
            "path": n if draw(st.integers(0, 3)) == 0 else f"build/{n}",
        }
        for n in names
    ]
    return draw(json_document(st.just(doc)))


@fuzz_settings(70, deadline_s=10)
@given(listings(), variant_listings())
@example((json.dumps([{"type": "directory", "oid": "0" * 40, "path": "x"}]).encode(), {}), b"[]")
@example((b"[]", {}), json.dumps([{"type": "directory", "oid": "0" * 40, "path": "x"}]).encode())
@example(
    (
        json.dumps(
            [
                harnesses.tree_entry(f"build/{VARIANT}/a", b""),
                {"type": "file", "oid": "0" * 40, "size": -5, "path": f"build/{VARIANT}/b"},
            ]
        ).encode(),
        {"a": b""},
    ),
    b"[]",
)
@example(
    (
        json.dumps(
            [{"type": "file", "oid": "0" * 40, "size": "12", "path": f"build/{VARIANT}/b"}]
        ).encode(),
        {},
    ),
    b"[]",
)
@example(
    (json.dumps([{"type": "file", "oid": "0" * 40, "size": 1, "path": 7}]).encode(), {}), b"[]"
)
@example(
    (
        json.dumps(
            [
                {
                    **harnesses.tree_entry(f"build/{VARIANT}/a", b""),
                    "lfs": {"oid": "x", "size": None, "pointerSize": 1},
                }
            ]
        ).encode(),
        {},
    ),
    b"[]",
)
@example(
    (
        json.dumps([harnesses.tree_entry(f"build/{VARIANT}/../../outside/pwned", b"x")]).encode(),
        {"../../outside/pwned": b"x"},
    ),
    b"[]",
)
@example(
    (
        b.tree_listing(b.variant_files({"x" * 300: b"long"}), VARIANT),
        b.variant_files({"x" * 300: b"long"}),
    ),
    b"[]",
)
def test_hub_listing(
    harness: harnesses.HubHarness, listing: tuple[bytes, dict[str, bytes]], variants: bytes
) -> None:
    raw, files = listing
    harness.check(VARIANT, raw, files, variants_listing=variants)


def test_valid_listing_fetches(harness: harnesses.HubHarness) -> None:
    """The harness reaches the success path: a real listing is fetched and published."""
    files = b.variant_files({"_ops.py": b"# ops\n"})
    harness.check(
        VARIANT,
        b.tree_listing(files, VARIANT, lfs=["_ops.py"]),
        files,
        b.variants_listing([VARIANT]),
    )
    assert harness.store.catalog.lookup(inv.REPO, inv.COMMIT, VARIANT) is not None
