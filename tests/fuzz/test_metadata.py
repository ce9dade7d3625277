"""metadata.json parsing and the digest check, alone and through the store's publish path
(plus what the daemon reads back from a published tree: metadata_to_proto, kernel-depends)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import harnesses
from tests.fuzz import invariants as inv
from tests.fuzz.strategies import HOSTILE_PATHS, fuzz_settings, json_document, raw_mutations

file_names = st.sampled_from(["__init__.py", "_ops.py", "layers.py", "lib/_k.abi3.so", "x/y/z.py"])
variant_files = st.dictionaries(
    file_names | st.sampled_from(HOSTILE_PATHS),
    st.binary(max_size=64),
    min_size=1,
    max_size=4,
)
depends = st.lists(
    st.fixed_dictionaries(
        {"repo-id": st.sampled_from(["org/dep", "a/b", "../x", "", "org/dep/extra"])},
        optional={
            "version": st.integers(-1, 2**40),
            "revision": st.sampled_from(["main", "", "v1"]),
        },
    ),
    max_size=2,
)


@st.composite
def metadata_and_files(draw: st.DrawFn) -> tuple[bytes, dict[str, bytes]]:
    """A metadata.json whose digest covers the files, then mutated (maybe after the digest)."""
    files = draw(variant_files)
    algorithm = draw(st.sampled_from(["sha256", "sha512"]))
    doc: dict[str, Any] = {
        "id": "_fuzz_kernel_abc123",
        "name": "fuzz-kernel",
        "version": draw(st.integers(0, 3)),
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": draw(st.sampled_from(["cpu", "cuda"])), "archs": ["9.0", "10.0a"]},
        "digest": {"algorithm": algorithm, "files": inv.metadata_digest(files, algorithm)},
        "kernel-depends": draw(depends),
        "deterministic": draw(st.booleans()),
    }
    raw = draw(json_document(st.just(doc)))
    if draw(st.integers(0, 4)) == 0:
        raw = draw(raw_mutations(raw))
    return raw, files


@fuzz_settings(300)
@given(metadata_and_files(), st.booleans())
@example((b"[" * 100_000, {"a.py": b""}), False)
@example((b"1" * 5000, {"a.py": b""}), False)
@example((json.dumps({"digest": {"algorithm": [], "files": {}}}).encode(), {"a.py": b""}), False)
def test_metadata_parse_and_digest(case: tuple[bytes, dict[str, bytes]], require: bool) -> None:
    raw, files = case
    inv.check_metadata(raw, files, require=require)


@pytest.fixture(scope="module")
def store_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harnesses.StoreHarness]:
    harness = harnesses.StoreHarness(tmp_path_factory.mktemp("fuzz-metadata"))
    yield harness
    harness.close()


@fuzz_settings(60, deadline_s=10)
@given(metadata_and_files())
@example((json.dumps({"kernel-depends": 5}).encode(), {"a.py": b""}))
@example(
    (json.dumps({"kernel-depends": [{"repo-id": "a/b", "version": 2**40}]}).encode(), {"a.py": b""})
)
@example(
    (json.dumps({"kernel-depends": [{"repo-id": "../x", "version": 1}]}).encode(), {"a.py": b""})
)
@example((b"{}", {"/".join(["d"] * 1200): b"deep"}))
def test_metadata_publish(
    store_harness: harnesses.StoreHarness, case: tuple[bytes, dict[str, bytes]]
) -> None:
    raw, files = case
    store_harness.publish({**files, "metadata.json": raw})


def test_publish_accepts_a_valid_variant(store_harness: harnesses.StoreHarness) -> None:
    """The harness reaches the success path (a fuzzer that only ever sees refusals is blind)."""
    files = {"__init__.py": b"X = 1\n"}
    meta = {"id": "_ok", "digest": {"algorithm": "sha256", "files": inv.metadata_digest(files)}}
    before = store_harness.store.space.usage().trees
    store_harness.publish({**files, "metadata.json": json.dumps(meta).encode()})
    assert store_harness.store.space.usage().trees == before + 1
