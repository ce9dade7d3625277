"""Version strings as variant choice reads and writes them: `2.13.0+cpu` -> (2, 13) -> `2.13`.

Free of other imports so that platform detection can normalise torch's version strings without
loading the variant rules (a warm load never needs them: see `fingerprint`).
"""

from __future__ import annotations

import re

_VERSION_PREFIX_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)*)")


def parse_version(text: str | None, *, parts: int | None = None) -> tuple[int, ...] | None:
    """Leading dotted-number prefix of a version string (`2.13.0+cpu` -> (2, 13, 0)).

    With `parts`, the result is cut or zero-padded to that many components. Empty -> None.
    """
    if text is None or not text.strip():
        return None
    m = _VERSION_PREFIX_RE.match(text)
    if m is None:
        raise ValueError(f"not a version: {text!r}")
    try:
        nums = tuple(int(p) for p in m.group(1).split("."))
    except ValueError:  # more digits than int() converts
        raise ValueError(f"not a version: {text[:20]!r}... has too many digits") from None
    if parts is not None:
        nums = (nums + (0,) * parts)[:parts]
    return nums


def dotted(version: tuple[int, ...] | None) -> str:
    """(2, 13) -> "2.13", as versions are shown in reasons and names; None -> ""."""
    return "" if version is None else ".".join(str(p) for p in version)
