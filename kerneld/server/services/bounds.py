"""Bounds on what a caller may send, the same on every route (gRPC, the Hub API endpoint).

Every string and list of a request is bounded here, before anything is parsed, remembered,
logged or written: a gRPC request may be 4 MiB and an HTTP request line 8 KiB, and whatever the
daemon keeps of it (leases, the negative cache, remembered answers, platforms.json, log lines,
the refs it forwards upstream) would otherwise grow by that much per call. The limits are far
above what a real client sends.
"""

from __future__ import annotations

#: `org/name`: two Hub names of at most 96 characters (`kerneld/store/paths.py`).
MAX_REPO_ID = 193
#: A branch, tag or commit (`paths.py` `_REF`).
MAX_REVISION = 255
#: One path component.
MAX_VARIANT = 255
#: A file's path inside a repository (`build/<variant>/...`).
MAX_PATH = 1024
#: The self-reported caller ("pid=123 kerneld_client"), kept with every lease.
MAX_CLIENT = 256
#: A lease id is 32 hex digits.
MAX_LEASE_ID = 64
#: Each string of PlatformFacts ("x86_64", "2.13", "gfx942:sramecc+:xnack-").
MAX_FACT = 64
#: Devices of one process.
MAX_DEVICES = 64
#: A tree digest: "sha256:" and 64 hex digits.
MAX_DIGEST = 71
#: Why a caller suspects a tree (ReportSuspect): one line of an error message, clipped by the
#: client; it goes into a log line and a quarantine entry.
MAX_REASON = 512


class RequestTooLarge(ValueError):
    """A request field over its bound (INVALID_ARGUMENT): names the field and the limit."""


def clip(text: str, limit: int = 96) -> str:
    """`text` for a log line or an error message: at most `limit` characters, with its full
    length when cut (a caller's string is never echoed whole)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text.encode('utf-8', 'replace'))} bytes)"


def check_field(value: str, limit: int, field: str) -> None:
    """RequestTooLarge when `value` is over `limit` UTF-8 bytes or holds a control character
    (it would break a log line or a terminal)."""
    if len(value) > limit // 4:  # a string this short cannot be over the limit
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise RequestTooLarge(
                f"{field} is {size} bytes, over its limit of {limit} bytes; send the real value"
            )
    if not value.isprintable() and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise RequestTooLarge(f"{field} contains a control character: {clip(value, 32)!r}")


def check_kernel_fields(
    repo_id: str, revision: str = "", variant: str = "", path: str = ""
) -> None:
    """RequestTooLarge unless a kernel's name, revision, variant and file path are in bounds
    (the fields every route takes from its caller)."""
    check_field(repo_id, MAX_REPO_ID, "repo_id")
    check_field(revision, MAX_REVISION, "revision")
    check_field(variant, MAX_VARIANT, "variant")
    check_field(path, MAX_PATH, "path")
