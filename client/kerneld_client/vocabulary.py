"""The names the client and the daemon must spell alike, each defined once: repo ids, commits,
machine names, device capabilities and platform fingerprints.

A rule that two places must agree on is written here and nowhere else (docs/architecture.md,
"One definition"): the client refusing a repo id the daemon accepts, or the daemon detecting a
GPU as `9.0` while the client reads `sm_90`, would each be a bug that no test of one side finds.
Each caller wraps a verdict in its own typed error (the store's `InvalidRepoError`, the client's
`ValueError`), so the rule is shared and the message stays where the context is.

Standard library only and no `re`: the client's warm path checks a repo id on every call.
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


def normalise_machine(machine: str, os_name: str) -> str:
    """`platform.machine()` as variant names spell it, as `kernels` does: macOS `arm64` and
    Windows `AMD64` are renamed, nothing else is (Linux already says `aarch64`/`x86_64`)."""
    if os_name == "darwin" and machine == "arm64":
        return "aarch64"
    if os_name == "windows" and machine == "AMD64":
        return "x86_64"
    return machine


def cuda_capability(major: int, minor: int) -> str:
    """A CUDA compute capability as kerneld spells it everywhere: `9.0` (not `sm_90`, not 90)."""
    return f"{major}.{minor}"


def rocm_target(major: int, minor: int, stepping: int) -> str:
    """A ROCm gfx target from its numbers: (9, 4, 2) -> `gfx942`, (9, 0, 10) -> `gfx90a`."""
    return f"gfx{major}{minor:x}{stepping:x}"


def parse_cuda_capability(text: str) -> tuple[int, int] | None:
    """`9.0` -> (9, 0); None when `text` is not a CUDA capability."""
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isascii() and minor.isascii() and major.isdigit() and minor.isdigit()):
        return None
    try:
        return int(major), int(minor)
    except ValueError:  # more digits than int() converts: not a capability anyone has
        return None


def parse_rocm_target(text: str) -> tuple[int, int, int] | None:
    """`gfx942` / `gfx90a:sramecc+:xnack-` -> (9, 4, 2) / (9, 0, 10); None otherwise."""
    target = text.strip().lower().split(":", maxsplit=1)[0]
    digits = target[3:]
    if not target.startswith("gfx") or len(digits) < 3 or not digits.isascii():
        return None
    major, minor, stepping = digits[:-2], digits[-2], digits[-1]
    if not major.isdigit() or minor not in _LOWER_HEX or stepping not in _LOWER_HEX:
        return None
    return int(major), int(minor, 16), int(stepping, 16)


def capability_number(text: str) -> int | None:
    """`"8.6"` -> 86; a ROCm target `"gfx942"` -> 94 (major 9, minor 4, as torch's
    `get_device_capability` reports it on ROCm); None when not understood. The numbers a layer
    mapping's `CUDAProperties`/`ROCMProperties` intervals hold."""
    cuda = parse_cuda_capability(text)
    if cuda is not None:
        return cuda[0] * 10 + cuda[1]
    rocm = parse_rocm_target(text)
    if rocm is not None:
        return rocm[0] * 10 + rocm[1]
    return None


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
