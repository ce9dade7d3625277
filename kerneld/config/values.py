"""Readers and writers of single kerneld.toml values: sizes, durations, file modes, paths,
loopback addresses, prefetch entries and signer identities.

Each reader takes the raw TOML value and the place it came from (`source`, the file or
"environment"; `key`, like `store.cap`) and returns the typed value or raises `ConfigError`
with the reason. The writers (`format_size`, `format_duration`, `prefetch_text`) spell a value
the way a person would write it, and always so that the reader gives back the same value: that
is what lets `dump_config` round-trip. The key table (`schema.py`) pairs them per key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from kerneld.config.errors import ConfigError
from kerneld.config.model import PrefetchEntry, ProvenanceIdentity
from kerneld.upstream.base import check_repo_id

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def parse_size(value: object, *, source: str, key: str) -> int:
    """`20GiB`, `500MB`, `1024` (bytes) -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            size = float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "B").lower()]
            if math.isfinite(size):  # '9' * 400 is a float infinity
                return int(size)
    raise ConfigError(source, key, f"expected a size like '20GiB' or a byte count, got {value!r}")


def parse_duration(value: object, *, source: str, key: str) -> float:
    """`90s`, `5m`, `1h30m`, `250ms`, or a number of seconds -> seconds (finite: an infinite
    lease or TTL cannot be written as a timestamp)."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "")
        parts = _DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds is not None and math.isfinite(seconds):
        return seconds
    raise ConfigError(source, key, f"expected a finite duration like '5m' or '90s', got {value!r}")


def parse_mode(value: object, *, source: str, key: str) -> int:
    """File mode: '0660' or 0o660."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o7777:
        return value
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3,4}", value):
        return int(value, 8)
    raise ConfigError(source, key, f"expected an octal mode like '0660', got {value!r}")


def parse_loopback(value: object, *, source: str, key: str) -> str:
    """`127.0.0.1:9464`: metrics are only ever served on loopback (or a unix socket)."""
    text = value if isinstance(value, str) else ""
    host, _, port = text.rpartition(":")
    if host not in LOOPBACK_HOSTS or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        raise ConfigError(
            source,
            key,
            f"expected a loopback HOST:PORT ({', '.join(LOOPBACK_HOSTS)}), got {value!r}",
        )
    return text


def parse_listen(value: object, *, source: str, key: str) -> str:
    """`HOST:PORT` of any address (`0.0.0.0:9464`, `[::]:9464`, `10.0.0.5:9464`); whether a
    non-loopback one is allowed is `[metrics] allow_remote`'s to say."""
    text = value if isinstance(value, str) else ""
    host, _, port = text.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (
        not bare
        or not re.fullmatch(r"[0-9A-Za-z.:_-]+", bare)
        or (":" in bare and not host.startswith("["))
        or not re.fullmatch(r"[0-9]{1,5}", port)
        or int(port) > 65535
    ):
        raise ConfigError(
            source, key, f"expected HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464), got {value!r}"
        )
    return text


def is_loopback(listen: str) -> bool:
    """Whether a `HOST:PORT` from `parse_listen` is a loopback address."""
    return listen.rpartition(":")[0] in LOOPBACK_HOSTS


def parse_bool(value: object, *, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, f"expected true or false, got {value!r}")
    return value


def parse_str(value: object, *, source: str, key: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(source, key, f"expected a non-empty string, got {value!r}")
    return value


def parse_group(value: object, *, source: str, key: str) -> str:
    """A group name for a socket; empty: the daemon's own group."""
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a group name, got {value!r}")
    return value


def parse_path(value: object, *, source: str, key: str) -> Path:
    """A non-empty path without NUL bytes (no file system call can take one)."""
    text = parse_str(value, source=source, key=key)
    if "\0" in text:
        raise ConfigError(source, key, f"a path cannot contain a NUL byte, got {text!r}")
    return Path(text)


def parse_prefetch_entry(text: str, *, source: str = "", key: str = "") -> PrefetchEntry:
    """`org/name` (main), `org/name:1` (version 1), `org/name@rev` (branch, tag or commit)."""
    m = re.fullmatch(r"([^/@:\s]+/[^/@:\s]+)(?::([0-9]{1,20})|@(\S+))?", text.strip())
    if not m:
        raise ConfigError(
            source, key, f"expected 'org/name', 'org/name:VERSION' or 'org/name@REV', got {text!r}"
        )
    try:
        check_repo_id(m.group(1))
    except ValueError as exc:
        raise ConfigError(source, key, str(exc)) from None
    return PrefetchEntry(
        m.group(1), version=int(m.group(2)) if m.group(2) else None, revision=m.group(3)
    )


def prefetch_text(entry: PrefetchEntry) -> str:
    """A prefetch entry as `parse_prefetch_entry` reads it."""
    if entry.version is not None:
        return f"{entry.repo_id}:{entry.version}"
    if entry.revision is not None:
        return f"{entry.repo_id}@{entry.revision}"
    return entry.repo_id


def parse_identity(value: object, *, source: str, key: str) -> ProvenanceIdentity:
    """One `[provenance] identities` entry: an OIDC identity and issuer, or a GitHub
    repository and its build workflows."""
    shape = (
        '{ identity = "...", issuer = "https://..." } or '
        '{ repository = "org/repo", workflows = ["https://github.com/org/repo/.github/'
        'workflows/build.yaml@refs/heads/main"] }'
    )
    if not isinstance(value, dict):
        raise ConfigError(source, key, f"expected a table like {shape}")
    keys = set(value)
    if keys == {"identity", "issuer"} and all(isinstance(value[k], str) and value[k] for k in keys):
        return ProvenanceIdentity(identity=value["identity"], issuer=value["issuer"])
    workflows = value.get("workflows")
    if (
        keys == {"repository", "workflows"}
        and isinstance(value["repository"], str)
        and value["repository"].count("/") == 1
        and isinstance(workflows, list)
        and workflows
        and all(isinstance(w, str) and w.startswith("https://") for w in workflows)
    ):
        return ProvenanceIdentity(repository=value["repository"], workflows=tuple(workflows))
    raise ConfigError(source, key, f"expected {shape}, got {value!r}")


def format_duration(seconds: float) -> str | float:
    """Seconds as the config writes them (`1h`, `1h30m`, `250ms`, `7d`); a value no unit sum
    reproduces exactly stays a number, so `parse_duration` always reads back the same float."""
    if seconds == 0:
        return "0s"
    millis = round(seconds * 1000)
    if millis <= 0 or abs(millis / 1000 - seconds) > 1e-9:
        return seconds
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis:
        parts.append(f"{millis}ms")
    text = "".join(parts)
    if parse_duration(text, source="", key="") != seconds:
        return seconds
    return text


def format_size(size: int) -> str | int:
    """Bytes as the config writes them: `20GiB` where a binary unit is exact, else the count."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        step = _SIZE_UNITS[unit.lower()]
        if size and size % step == 0:
            return f"{size // step}{unit}"
    return size


def format_mode(mode: int) -> str:
    """A file mode as the config writes it: `0660`."""
    return f"{mode:04o}"


def plain_number(value: float) -> int | float:
    """60.0 as 60: a rate a person wrote as an integer reads back as one."""
    return int(value) if value.is_integer() else value
