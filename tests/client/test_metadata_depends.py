"""`kernel-depends`, read one way by the daemon, kerneldctl and the client (`_metadata`)."""

from __future__ import annotations

import pytest

from kerneld_client._metadata import kernel_depends
from kerneld_client.lockfile import Dependency


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
    """The daemon's resolver, kerneldctl lock, the RPC's metadata and the client's loader all
    read `kernel-depends` through kernel_depends (a second parser would drift)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readers = [
        "kerneld/resolve.py",
        "kerneld/ctl/cmd_lock.py",
        "kerneld/server/convert.py",
        "client/kerneld_client/loading/materialize.py",
    ]
    for rel in readers:
        text = (root / rel).read_text(encoding="utf-8")
        assert "kernel_depends(" in text, rel
        assert '.get("repo-id")' not in text, f"{rel} parses entries itself"
