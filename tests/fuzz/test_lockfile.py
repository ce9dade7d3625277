"""kernels.lock (both formats) and [tool.kernels.dependencies]: LockfileError or valid locks."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import invariants as inv
from tests.fuzz.strategies import (
    HOSTILE_STRINGS,
    bytes_of,
    fuzz_settings,
    json_document,
    raw_mutations,
    toml_document,
    toml_string,
    toml_value,
    toml_values,
)

repo_ids = st.sampled_from(["org/name", "kernels-community/activation", "a/b", "A.b/c-d_e"])
commits = st.text("0123456789abcdefABCDEF", min_size=40, max_size=40) | st.text(
    "0123456789abcdef", min_size=64, max_size=64
)
new_entry = st.fixed_dictionaries(
    {
        "dependency": st.fixed_dictionaries(
            {"repo-id": repo_ids},
            optional={
                "version": st.integers(0, 2**64 - 1),
                "revision": st.sampled_from(["main", "v1", "refs/pr/1"]),
            },
        ),
        "lock": st.fixed_dictionaries({"commit": commits}),
    }
)
old_entry = st.fixed_dictionaries(
    {
        "repo_id": repo_ids,
        "sha": st.text("0123456789abcdef", min_size=40, max_size=40),
        "variants": st.dictionaries(
            st.sampled_from(["torch-universal", "torch213-cxx11-cpu-x86_64-linux", "torch-cuda"]),
            st.fixed_dictionaries(
                {
                    "hash": st.text("0123456789abcdef", min_size=64, max_size=64).map(
                        "sha256-".__add__
                    )
                },
                optional={"hash_type": st.just("git_lfs_concat")},
            ),
            max_size=3,
        ),
    }
)
lock_docs = st.lists(new_entry, max_size=4) | st.lists(old_entry, max_size=4)


def lockfiles() -> st.SearchStrategy[bytes]:
    return json_document(lock_docs)


@fuzz_settings(300)
@given(bytes_of(lockfiles))
@example(b"[" * 100_000)
@example(json.dumps([{"dependency": {"repo-id": "a/b", "version": 10**30}, "lock": {}}]).encode())
def test_lockfile(data: bytes) -> None:
    inv.check_lockfile(data)


@fuzz_settings(100)
@given(st.text(max_size=200) | st.sampled_from(HOSTILE_STRINGS))
def test_lockfile_text(text: str) -> None:
    inv.check_lockfile(text)


@st.composite
def pyprojects(draw: st.DrawFn) -> bytes:
    """A pyproject.toml with a [tool.kernels.dependencies] table of mostly valid entries."""
    deps = draw(
        st.dictionaries(
            repo_ids | st.sampled_from([s for s in HOSTILE_STRINGS if len(s) < 400]),
            st.integers(-5, 2**65) | toml_values,
            max_size=4,
        )
    )
    lines = ["[project]", 'name = "demo"', "", "[tool.kernels.dependencies]"]
    lines += [f"{toml_string(k)} = {toml_value(v)}" for k, v in deps.items()]
    if draw(st.booleans()):
        lines.insert(0, toml_document({"tool": {"kernels": draw(toml_values)}}))
    return "\n".join(lines).encode("utf-8", "surrogatepass")


@fuzz_settings(100)
@given(pyprojects() | pyprojects().flatmap(raw_mutations))
@example(b"[tool.kernels.dependencies]\nx = " + b"[" * 5000)
def test_pyproject(tmp_path: Path, data: bytes) -> None:
    inv.check_pyproject(data, tmp_path)
