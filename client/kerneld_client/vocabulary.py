"""The names the client and the daemon must spell alike, each defined once: repo ids, commits
and platform fingerprints (machine names and device capabilities: `device_names`).

A rule that two places must agree on is written here and nowhere else (docs/architecture.md,
"One definition"): the client refusing a repo id the daemon accepts, or the two computing
another fingerprint for the same platform, would each be a bug that no test of one side finds.
Each caller wraps a verdict in its own typed error (the store's `InvalidRepoError`, the client's
`ValueError`), so the rule is shared and the message stays where the context is.

Standard library only and no `re`: the client's warm path imports it and checks a repo id on
every call, so what it does not use lives elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A Hub repo id is `org/name`; each part is 1-96 of these characters, starting with a letter or
#: digit, with no `..` anywhere (a path trick once it names a directory).
REPO_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
REPO_PART_MAX = 96
#: The longest repo id: two parts and the slash.
REPO_ID_MAX = 2 * REPO_PART_MAX + 1
_ALNUM = REPO_ID_CHARS[:62]
_LOWER_HEX = "0123456789abcdef"
#: A git commit id as the Hub returns it: 40 lower-case hex digits.
COMMIT_LENGTH = 40
#: The shortest commit prefix a deny accepts (as git abbreviates): shorter ones name too many.
MIN_COMMIT_PREFIX = 7


def _repo_part(part: str) -> bool:
    return 0 < len(part) <= REPO_PART_MAX and part[0] in _ALNUM and not part.strip(REPO_ID_CHARS)


def is_repo_id(value: object) -> bool:
    """Is `value` an `org/name` the Hub could have (and not a path trick)?"""
    if not isinstance(value, str) or ".." in value:
        return False
    org, _, name = value.partition("/")
    return _repo_part(org) and _repo_part(name)


def repo_key(repo: str) -> str:
    """The form two repo ids are compared in: the Hub resolves `Org/Name` to the repo `org/name`
    (ids are unique case-insensitively), so a policy that compared the spelling would let a
    case variant through. Repo ids are ASCII (`REPO_ID_CHARS`), so `lower` is the whole rule."""
    return repo.lower()


def is_hex(value: object, length: int) -> bool:
    """`length` lower-case hex digits (a commit, a sha256 digest)."""
    return isinstance(value, str) and len(value) == length and not value.strip(_LOWER_HEX)


def is_commit(value: object) -> bool:
    """A full commit id (40 lower-case hex digits), not a branch or tag that looks like one."""
    return is_hex(value, COMMIT_LENGTH)


def is_commit_prefix(value: object) -> bool:
    """A commit abbreviated as git does: `MIN_COMMIT_PREFIX` to 39 lower-case hex digits."""
    return (
        isinstance(value, str)
        and MIN_COMMIT_PREFIX <= len(value) < COMMIT_LENGTH
        and not value.strip(_LOWER_HEX)
    )


_ABI = {True: "cxx11", False: "cxx98", None: "noabi"}


def _field(text: str) -> str:
    """A free-text fact (CPU, OS) that cannot run into the next field."""
    return text.replace("%", "%25").replace("-", "%2D")


def fingerprint(facts: Mapping[str, Any]) -> str:
    """The fingerprint of facts in `PlatformFacts.to_dict()` form (ValueError if malformed):
    the name the daemon publishes picks under (`variants.fingerprints` tells what is in it)."""
    try:
        torch = str(facts.get("torch_version") or "")
        backend = facts.get("backend") or {"type": "cpu"}
        parts = [
            f"torch{torch}" if torch else "notorch",
            _ABI[facts.get("cxx11_abi")],
            f"{backend['type']}{backend.get('version') or ''}",
            _field(str(facts["cpu"])),
            _field(str(facts["os"])),
        ]
        python = ".".join(str(facts.get("python_version") or "").split(".")[:2])
        parts.append(f"py{python}{'t' if facts.get('free_threaded') else ''}")
        macos = str(facts.get("macos_version") or "")
        if macos:
            parts.append(f"macos{macos.split('.', maxsplit=1)[0]}")
        tvm_ffi = str(facts.get("tvm_ffi_version") or "")
        if tvm_ffi:
            parts.append(f"tvmffi{tvm_ffi}")
        if facts.get("mlx"):
            parts.append("mlx")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not platform facts: {exc!r}") from None
    return "-".join(parts)
