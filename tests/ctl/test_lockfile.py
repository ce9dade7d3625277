"""kerneld_client.lockfile: both lock formats, the git_lfs_concat hash, pyproject dependencies.

Byte compatibility is checked against the real `kernels` 0.17.2 serializer (its Rust
`KernelLocks.to_json`), on hand-picked cases and on generated ones; the parsers are fuzzed to show
that malformed input only ever raises `LockfileError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneld_client.lockfile import (
    Dependency,
    Lock,
    LockfileError,
    dumps_locks,
    git_blob_sha1,
    git_lfs_concat_hash,
    load_lockfile,
    parse_lockfile,
    read_pyproject_dependencies,
    write_lockfile,
)

C1, C2, C3 = "1" * 40, "2" * 40, "a" * 40


def entry(repo: str, commit: str, **dep: object) -> dict[str, object]:
    return {"dependency": {"repo-id": repo, **dep}, "lock": {"commit": commit}}


# ---- 0.17 format --------------------------------------------------------------------------------


def test_parse_017() -> None:
    doc = [entry("org/a", C1, version=1), entry("org/a", C2, revision="main")]
    lock = parse_lockfile(json.dumps(doc))
    assert lock.format == "0.17"
    assert lock.locks == (
        Lock(Dependency("org/a", version=1), C1),
        Lock(Dependency("org/a", revision="main"), C2),
    )
    assert lock.pinned() == [("org/a", C1, "v1"), ("org/a", C2, "main")]
    assert parse_lockfile("[]").locks == ()


def test_commit_is_normalised_to_lowercase_as_kernels_does() -> None:
    lock = parse_lockfile(json.dumps([entry("org/a", "ABCDEF" + "0" * 34, version=1)]))
    assert lock.locks[0].commit == "abcdef" + "0" * 34


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "expected a JSON list"),
        ([entry("org/a", C1, version=1) | {"x": 1}], "unknown field `x`"),
        ([entry("org/a", C1, version=1, x=2)], "unknown field `x` in `dependency`"),
        (
            [{"dependency": {"repo-id": "org/a", "version": 1}, "lock": {"commit": C1, "y": 0}}],
            "unknown field `y` in `lock`",
        ),
        ([entry("org/a", C1, version=1), entry("org/a", C2, version=1)], "duplicate dependency"),
        ([entry("org/a", C1, version=1, revision="main")], "mutually exclusive"),
        ([entry("org/a", C1)], "either `version` or `revision`"),
        ([entry("org/a", C1, version=-1)], "out of range"),
        ([entry("org/a", C1, version="1")], "non-negative integer"),
        ([entry("org/a", C1, version=True)], "non-negative integer"),
        ([entry("org/a", C1, version=1.0)], "non-negative integer"),
        ([entry("org/a", C1, revision="")], "non-empty string"),
        ([entry("org/a", "main", version=1)], "full git object id"),
        ([entry("not-a-repo", C1, version=1)], "org/name"),
        ([{"dependency": {"repo-id": "org/a", "version": 1}}], "missing field `lock`"),
        (
            [entry("org/a", C1, version=1), {"repo_id": "org/b", "sha": C1, "variants": {}}],
            "mixes the old format",
        ),
        ([3], "expected an object"),
    ],
)
def test_017_errors_name_file_entry_and_problem(doc: object, message: str) -> None:
    with pytest.raises(LockfileError) as info:
        parse_lockfile(json.dumps(doc), source="proj/kernels.lock")
    text = str(info.value)
    assert text.startswith("proj/kernels.lock")
    assert message in text
    if isinstance(doc, list) and len(doc) > 1 and "duplicate" in message:
        assert "entry 1" in text and "also entry 0" in text


def test_duplicate_json_keys_and_non_json_are_rejected() -> None:
    raw = (
        '[{"dependency": {"repo-id": "org/a", "version": 1, "version": 2}, '
        '"lock": {"commit": "%s"}}]'
    )
    with pytest.raises(LockfileError, match="duplicate key 'version'"):
        parse_lockfile(raw % C1)
    with pytest.raises(LockfileError, match="not valid JSON"):
        parse_lockfile("[NaN]")
    with pytest.raises(LockfileError, match="not UTF-8"):
        parse_lockfile(b"\xff\xfe[]")
    with pytest.raises(LockfileError, match="not valid JSON"):
        parse_lockfile("[" * 100_000 + "]" * 100_000)


def test_the_real_kernels_parser_agrees_on_what_is_invalid() -> None:
    from kernels._rust import KernelLocks

    bad = [
        [entry("org/a", C1, version=1) | {"x": 1}],
        [entry("org/a", C1, version=1), entry("org/a", C2, version=1)],
        [entry("org/a", C1, version=1, revision="main")],
        [entry("org/a", C1)],
        [entry("org/a", C1, version=-1)],
        [entry("org/a", "main", version=1)],
    ]
    for doc in bad:
        text = json.dumps(doc)
        with pytest.raises(ValueError):
            KernelLocks.from_json(text)
        with pytest.raises(LockfileError):
            parse_lockfile(text)


def _kernels_to_json(locks: list[Lock]) -> str:
    from kernels._rust import KernelDependency, KernelLock, KernelLocks, KernelVersion

    table = {}
    for x in locks:
        d = x.dependency
        version = (
            KernelVersion.Version(d.version)
            if d.version is not None
            else KernelVersion.Revision(str(d.revision))
        )
        table[KernelDependency(d.repo_id, version)] = KernelLock(x.commit)
    return str(KernelLocks(table).to_json())


def test_dumps_is_byte_identical_to_kernels() -> None:
    locks = [
        Lock(Dependency("zorg/b", version=1), C1),
        Lock(Dependency("aorg/a", revision="main"), C2),
        Lock(Dependency("aorg/a", version=10), C3),
        Lock(Dependency("aorg/a", version=2), C1),
        Lock(Dependency("Aorg/a", version=1), "f" * 64),
        Lock(Dependency("aorg/a", revision="Zeta"), C2),
    ]
    assert dumps_locks(locks) == _kernels_to_json(locks)
    assert dumps_locks([]) == _kernels_to_json([]) == "[]"


repo_part = st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=12)
repo_ids = st.builds(
    lambda a, b: f"{a}/{b}",
    repo_part.filter(lambda s: s[0].isalnum() and ".." not in s),
    repo_part.filter(lambda s: s[0].isalnum() and ".." not in s),
)
deps = st.one_of(
    st.builds(lambda r, v: Dependency(r, version=v), repo_ids, st.integers(0, 2**40)),
    st.builds(
        lambda r, v: Dependency(r, revision=v),
        repo_ids,
        st.text(alphabet=string.printable + "éü", min_size=1, max_size=20),
    ),
)
commits = st.sampled_from([40, 64]).flatmap(
    lambda n: st.text(alphabet="0123456789abcdef", min_size=n, max_size=n)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(deps, commits, max_size=8))
def test_dumps_matches_kernels_and_round_trips(table: dict[Dependency, str]) -> None:
    locks = [Lock(d, c) for d, c in table.items()]
    text = dumps_locks(locks)
    assert text == _kernels_to_json(locks)
    assert set(parse_lockfile(text).locks) == set(locks)


def test_write_and_load(tmp_path: Path) -> None:
    path = tmp_path / "kernels.lock"
    write_lockfile(path, [Lock(Dependency("org/a", version=1), C1)])
    assert not path.read_bytes().endswith(b"\n")
    assert load_lockfile(path).locks[0].commit == C1
    with pytest.raises(LockfileError, match="cannot read"):
        load_lockfile(tmp_path / "missing.lock")


# ---- old format ---------------------------------------------------------------------------------


def old_entry(repo: str = "org/a", sha: str = C1, **variants: str) -> dict[str, object]:
    return {
        "repo_id": repo,
        "sha": sha,
        "variants": {v: {"hash": h, "hash_type": "git_lfs_concat"} for v, h in variants.items()},
    }


def test_parse_old_format() -> None:
    h = "sha256-" + "0" * 64
    lock = parse_lockfile(json.dumps([old_entry(**{"torch-universal": h})]))
    assert lock.format == "old"
    assert lock.old[0].repo_id == "org/a"
    assert lock.old[0].variants["torch-universal"].hash == h
    assert lock.pinned() == [("org/a", C1, None)]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([old_entry() | {"extra": 1}], "unknown field `extra`"),
        ([old_entry(sha="main")], "40-hex commit"),
        ([old_entry(**{"torch-cpu": "md5-00"})], "sha256-<64 lowercase hex>"),
        (
            [
                {
                    "repo_id": "org/a",
                    "sha": C1,
                    "variants": {"x": {"hash": "sha256-" + "0" * 64, "hash_type": "nar"}},
                }
            ],
            "unsupported hash_type",
        ),
        ([old_entry(), old_entry()], "duplicate kernel"),
        ([{"repo_id": "org/a", "sha": C1}], "missing field `variants`"),
        ([old_entry(), entry("org/b", C1, version=1)], "mixes the 0.17 format"),
    ],
)
def test_old_format_errors(doc: object, message: str) -> None:
    with pytest.raises(LockfileError, match=message) as info:
        parse_lockfile(json.dumps(doc), source="old.lock")
    assert str(info.value).startswith("old.lock: entry ")


def test_git_lfs_concat_hash_by_its_definition() -> None:
    so = b"\x7fELF" * 10
    init = b"from . import x\n"
    files = [
        ("__init__.py", git_blob_sha1(init)),
        ("_ops/lib.so", hashlib.sha256(so).hexdigest()),
        ("__pycache__/x.cpython-311.pyc", git_blob_sha1(b"junk")),
        ("y.pyc", git_blob_sha1(b"junk")),
    ]
    h = hashlib.sha256()
    h.update(b"__init__.py")
    h.update(hashlib.sha1(b"blob %d\0" % len(init) + init).digest())
    h.update(b"_ops/lib.so")
    h.update(hashlib.sha256(so).digest())
    assert git_lfs_concat_hash(files) == "sha256-" + h.hexdigest()
    assert git_lfs_concat_hash(reversed(files)) == git_lfs_concat_hash(files)
    with pytest.raises(ValueError, match="file id"):
        git_lfs_concat_hash([("a", "xyz")])


# ---- pyproject ----------------------------------------------------------------------------------


def test_pyproject_dependencies(tmp_path: Path) -> None:
    p = tmp_path / "pyproject.toml"
    p.write_text('[tool.kernels.dependencies]\n"org/b" = 2\n"org/a" = 1\n')
    assert read_pyproject_dependencies(p) == [
        Dependency("org/b", version=2),
        Dependency("org/a", version=1),
    ]
    for body, message in (
        ("[project]\nname='x'\n", "no \\[tool.kernels.dependencies\\]"),
        ('[tool.kernels.dependencies]\n"org/a" = "main"\n', "must be an integer"),
        ('[tool.kernels.dependencies]\n"bad" = 1\n', "org/name"),
        ("[tool.kernels\n", "not valid TOML"),
    ):
        p.write_text(body)
        with pytest.raises(LockfileError, match=message):
            read_pyproject_dependencies(p)


# ---- fuzzing: only LockfileError ever escapes ---------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
lock_like = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "dependency": st.dictionaries(
                st.sampled_from(["repo-id", "version", "revision", "x"]), json_values, max_size=4
            ),
            "lock": st.dictionaries(st.sampled_from(["commit", "y"]), json_values | commits),
            "repo_id": st.text(max_size=12) | repo_ids,
            "sha": commits | st.text(max_size=5),
            "variants": st.dictionaries(st.text(max_size=10), json_values, max_size=3),
        },
    ),
    max_size=4,
)


def _only_typed_errors(data: str | bytes) -> None:
    with contextlib.suppress(LockfileError):
        parse_lockfile(data)


@settings(max_examples=200, deadline=None)
@given(json_values | lock_like)
def test_fuzz_structured(value: object) -> None:
    _only_typed_errors(json.dumps(value))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_fuzz_raw(data: str | bytes) -> None:
    _only_typed_errors(data)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=200))
def test_fuzz_pyproject(tmp_path: Path, text: str) -> None:
    p = tmp_path / "pyproject.toml"
    p.write_text("[tool.kernels.dependencies]\n" + text, encoding="utf-8")
    with contextlib.suppress(LockfileError):
        read_pyproject_dependencies(p)
