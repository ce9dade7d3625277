"""Mirror documents (manifests, refs, mirror-info): MirrorFormatError only, and what a mirror
upstream serves from them: UpstreamError only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kerneld.mirror.documents import MirrorWriter
from tests.fuzz import invariants as inv
from tests.fuzz.strategies import HOSTILE_PATHS, bytes_of, fuzz_settings, json_document

files = st.lists(
    st.tuples(
        st.sampled_from(["metadata.json", "__init__.py", "_ops.py", "a/b.py"])
        | st.sampled_from(HOSTILE_PATHS),
        st.binary(max_size=32),
        st.booleans(),
        st.booleans(),
    ),
    max_size=3,
)


def _entry(path: str, data: bytes, plain_git: bool, executable: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "path": path,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "git_sha1": hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        if plain_git
        else None,
    }
    if executable:
        entry["mode"] = "0755"
    return entry


manifests = st.builds(
    lambda variants: {
        "repo_id": inv.REPO,
        "commit": inv.COMMIT,
        "variants": {name: {"files": [_entry(*f) for f in fs]} for name, fs in variants.items()},
    },
    st.dictionaries(
        st.sampled_from(["torch-universal", "torch213-cxx11-cpu-x86_64-linux", "..", "a/b", ""]),
        files,
        max_size=3,
    ),
)
refs = st.fixed_dictionaries(
    {
        "repo_id": st.just(inv.REPO),
        "branches": st.dictionaries(st.sampled_from(["main", "v1", "v2"]), st.just(inv.COMMIT)),
        "tags": st.dictionaries(st.sampled_from(["t1"]), st.just(inv.COMMIT)),
    },
    optional={"exported_at": st.floats(allow_nan=True, allow_infinity=True) | st.integers()},
)
infos = st.fixed_dictionaries(
    {"format": st.just("kerneld-mirror"), "version": st.just(1)},
    optional={"name": st.text(max_size=8)},
)


def documents() -> st.SearchStrategy[bytes]:
    return json_document(manifests | refs | infos)


@fuzz_settings(250)
@given(bytes_of(documents))
@example(b"[" * 100_000)
@example(b"1" * 5000)
@example(b'{"a":' * 50_000)
@example(  # files out of path order still round-trip (found by the atheris target)
    json.dumps(
        {
            "repo_id": inv.REPO,
            "commit": inv.COMMIT,
            "variants": {
                "v": {"files": [_entry("b", b"", False, True), _entry("", b"", False, False)]}
            },
        }
    ).encode()
)
def test_mirror_documents(data: bytes) -> None:
    inv.check_mirror_documents(data)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fuzz-mirror")
    MirrorWriter(root, name="fuzz").write_info()
    yield root


@fuzz_settings(60, deadline_s=5)
@given(bytes_of(documents), bytes_of(documents))
@example(b"[" * 100_000, b"{}")
def test_mirror_upstream(mirror: Path, manifest: bytes, refs_doc: bytes) -> None:
    """MirrorDirUpstream reading fuzzed manifests and refs from a real mirror directory."""
    from kerneld.mirror.documents import manifest_path, refs_path
    from kerneld.mirror.upstream import MirrorDirUpstream
    from kerneld.upstream.errors import UpstreamError

    writer = MirrorWriter(mirror)
    writer.write_file(manifest_path(inv.REPO, inv.COMMIT), manifest)
    writer.write_file(refs_path(inv.REPO), refs_doc)
    up = MirrorDirUpstream(mirror)
    allowed = (UpstreamError,)
    for rev in ("main", "v1", inv.COMMIT, "refs/tags/t1"):
        commit = inv.typed(partial(up.resolve_revision, inv.REPO, rev), allowed, "resolve")
        inv.expect(commit.value is None or inv.HEX40.fullmatch(commit.value), f"{commit.value!r}")
    inv.typed(lambda: up.list_refs(inv.REPO), allowed, "list_refs")
    names = inv.typed(lambda: up.list_variants(inv.REPO, inv.COMMIT), allowed, "list_variants")
    for name in names.value or []:
        inv.typed(partial(up.list_files, inv.REPO, inv.COMMIT, name), allowed, "list_files")
