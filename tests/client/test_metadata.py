"""metadata.json's `kernel-depends` and `backend`, read one way by the daemon, kerneldctl and
the client (`kerneld_client.metadata`)."""

from __future__ import annotations

import pytest

from kerneld_client.lockfile import Dependency
from kerneld_client.metadata import backend_of, kernel_depends


def test_entries_by_version_or_revision_in_their_order() -> None:
    doc = {
        "kernel-depends": [
            {"repo-id": "org/a", "version": 2},
            {"repo-id": "org/b", "revision": "main"},
            {"repo-id": "org/c", "version": 0, "revision": "ignored"},  # the version wins
        ]
    }
    assert kernel_depends(doc) == [
        Dependency("org/a", version=2),
        Dependency("org/b", revision="main"),
        Dependency("org/c", version=0),
    ]
    assert kernel_depends({}) == [] and kernel_depends({"kernel-depends": None}) == []
    assert kernel_depends(["not", "a", "document"]) == []


@pytest.mark.parametrize(
    ("depends", "why"),
    [
        ({"repo-id": "org/a"}, "needs a 'version' or a non-empty 'revision'"),
        ({"repo-id": "org/a", "revision": ""}, "needs a 'version' or a non-empty 'revision'"),
        ({"repo-id": "org/a", "version": True}, "'version' is not an integer"),
        ({"repo-id": "org/a", "version": "1"}, "'version' is not an integer"),
        ({"repo-id": "org/a", "version": 2**32}, "'version' is out of range"),
        ({"repo-id": "org/a", "version": -1}, "'version' is out of range"),
        ({"version": 1}, "expected a string 'repo-id'"),
        ("org/a", "expected a string 'repo-id'"),
    ],
)
def test_a_bad_entry_says_what_is_wrong(depends: object, why: str) -> None:
    with pytest.raises(ValueError, match="bad 'kernel-depends' entry") as info:
        kernel_depends({"kernel-depends": [{"repo-id": "org/ok", "version": 1}, depends]})
    assert why in str(info.value)


def test_a_list_is_required() -> None:
    with pytest.raises(ValueError, match="'kernel-depends' must be a list, got dict"):
        kernel_depends({"kernel-depends": {"repo-id": "org/a", "version": 1}})


def test_every_reader_uses_the_one_rule() -> None:
    """The daemon's acquire path, kerneldctl lock, the RPC's metadata and the client's loader all
    read `kernel-depends` through kernel_depends (a second parser would drift)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readers = [
        "kerneld/pipeline/acquire.py",
        "kerneld/ctl/cmd_lock.py",
        "kerneld/server/fronts/rpc/convert.py",
        "client/kerneld_client/loading/materialize.py",
    ]
    for rel in readers:
        text = (root / rel).read_text(encoding="utf-8")
        assert "kernel_depends(" in text, rel
        assert '.get("repo-id")' not in text, f"{rel} parses entries itself"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"backend": {"type": "cuda", "archs": ["8.0", "9.0a"]}}, ("cuda", ["8.0", "9.0a"])),
        ({"backend": {"type": "cpu"}}, ("cpu", [])),
        ({"backend": {"type": "cuda", "archs": ["8.0", 9.0, None]}}, ("cuda", ["8.0"])),
        ({"backend": {"type": "cuda", "archs": "8.0"}}, ("cuda", [])),
        ({"backend": {"type": 3, "archs": ["8.0"]}}, (None, ["8.0"])),
        ({"backend": "cuda"}, (None, [])),
        ({}, (None, [])),
        ([], (None, [])),
    ],
)
def test_backend_type_and_archs(doc: object, expected: tuple[str | None, list[str]]) -> None:
    assert backend_of(doc) == expected


def test_every_backend_reader_uses_the_one_rule() -> None:
    """The store's published variant list, the RPC's metadata, `kerneldctl info` and the
    client's device check all read `backend` through backend_of."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readers = [
        "kerneld/store/manifest.py",
        "kerneld/server/fronts/rpc/convert.py",
        "kerneld/ctl/listing.py",
        "client/kerneld_client/loading/materialize.py",
    ]
    for rel in readers:
        text = (root / rel).read_text(encoding="utf-8")
        assert "backend_of(" in text, rel
        assert '.get("archs")' not in text, f"{rel} reads archs itself"
