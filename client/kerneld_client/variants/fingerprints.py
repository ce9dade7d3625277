"""A platform's fingerprint: every fact variant choice reads, as one short readable string.

The daemon publishes, per commit and per fingerprint of the platforms its clients showed, the
variant `decide()` picks (`picks` in the published index), so a warm load looks its own
fingerprint up instead of ranking the variants itself: it never imports the rules (their enums
and dataclasses were 4 ms of every process's start-up).

Both sides compute the fingerprint from the same form, `PlatformFacts.to_dict()`: the daemon from
the facts a client sent, the client from its detection, which produces that form without
building `PlatformFacts` (`kerneld_client.platform`). What `decide()` does not read is left out
(device capabilities, checked before import; the Python micro version; whether the backend was
asked for explicitly), so platforms that differ only there share their picks. The Python
major.minor is always in it: a new-format name (`cpython-3.12-abi3`) names a minimum Python;
and whether it is free-threaded (`t`): abi3, every legacy arch name, never loads there.
Example::

    torch2.13-cxx11-cuda13.0-x86_64-linux-py3.12   (py3.13t when free-threaded; + -macos26,
                                                    -tvmffi0.1, -mlx when set)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ABI = {True: "cxx11", False: "cxx98", None: "noabi"}


def _field(text: str) -> str:
    """A free-text fact (CPU, OS) that cannot run into the next field."""
    return text.replace("%", "%25").replace("-", "%2D")


def fingerprint(facts: Mapping[str, Any]) -> str:
    """The fingerprint of facts in `PlatformFacts.to_dict()` form (ValueError if malformed)."""
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
