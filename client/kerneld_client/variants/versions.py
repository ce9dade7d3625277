"""Version strings as variant choice reads and writes them: `2.13.0+cpu` -> (2, 13) -> `2.13`.

Free of imports (even `re`: compiling the pattern cost 0.1 ms in every process) so that platform
detection can normalise torch's version strings without loading the variant rules (a warm load
never needs them: see `fingerprints`).
"""

from __future__ import annotations

_DIGITS = "0123456789"


def _leading_numbers(text: str) -> list[str]:
    """The dotted run of ASCII digit groups `text` starts with (after whitespace): what the
    pattern `\\s*([0-9]+(?:\\.[0-9]+)*)` matches, as a list of groups."""
    body = text.lstrip()
    groups: list[str] = []
    start = 0
    while True:
        end = start
        while end < len(body) and body[end] in _DIGITS:
            end += 1
        if end == start:
            return groups
        groups.append(body[start:end])
        if end + 1 < len(body) and body[end] == "." and body[end + 1] in _DIGITS:
            start = end + 1
        else:
            return groups


def parse_version(text: str | None, *, parts: int | None = None) -> tuple[int, ...] | None:
    """Leading dotted-number prefix of a version string (`2.13.0+cpu` -> (2, 13, 0)).

    With `parts`, the result is cut or zero-padded to that many components. Empty -> None.
    """
    if text is None or not text.strip():
        return None
    groups = _leading_numbers(text)
    if not groups:
        raise ValueError(f"not a version: {text!r}")
    try:
        nums = tuple(int(p) for p in groups)
    except ValueError:  # more digits than int() converts
        raise ValueError(f"not a version: {text[:20]!r}... has too many digits") from None
    if parts is not None:
        nums = (nums + (0,) * parts)[:parts]
    return nums


def dotted(version: tuple[int, ...] | None) -> str:
    """(2, 13) -> "2.13", as versions are shown in reasons and names; None -> ""."""
    return "" if version is None else ".".join(str(p) for p in version)
