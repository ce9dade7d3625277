"""The kerneld.toml key table: every key, the `Config` field it sets, and how its value is read
(validated) and written back.

This is the one list of the configuration's keys. `parse.py` reads a file through it (unknown
keys, types, ranges), `dump.py` writes a `Config` back through it (`kerneld --check-config`),
`KNOWN_KEYS` and `FIELD_KEYS` are derived from it, and scripts/gen_reference.py takes the keys
of docs/configuration.md from it. Defaults are the `Config` fields' own (`model.py`); the words
that explain a key are the comments above it in systemd/kerneld.toml, which a test keeps
covering every key here.
"""

from __future__ import annotations

import grp
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kerneld.config.errors import ConfigError
from kerneld.config.model import (
    LOG_LEVELS,
    PROVENANCE_POLICIES,
    TRUST_MODES,
    PrefetchEntry,
    ProvenanceIdentity,
)
from kerneld.config.upstream_tables import UPSTREAM_KEYS, read_upstreams, upstream_tables
from kerneld.config.values import (
    format_duration,
    format_mode,
    format_size,
    parse_bool,
    parse_duration,
    parse_group,
    parse_identity,
    parse_listen,
    parse_loopback,
    parse_mode,
    parse_path,
    parse_prefetch_entry,
    parse_size,
    plain_number,
    prefetch_text,
)


class Reader(Protocol):
    """Reads one raw TOML value found at `key` of `source`, or raises ConfigError."""

    def __call__(self, value: object, *, source: str, key: str) -> Any: ...


def _as_is(value: Any) -> object:
    return value


@dataclass(frozen=True)
class Kind:
    """A key's type: how its value is read (and checked), and how it is written back so that
    `read` gives the same value again."""

    read: Reader
    write: Callable[[Any], object] = _as_is


@dataclass(frozen=True)
class Key:
    """One kerneld.toml key: `[section] name` (section "" for the top level) sets `field` of
    `Config` (`user_socket.mode`: one part of a nested value)."""

    section: str
    name: str
    field: str
    kind: Kind
    #: Unset (None, or "" where the reader refuses "") is left out of a dump: TOML has no null.
    optional: bool = False
    #: The keys of each table when the value is an array of tables (`[[upstream]]`).
    table_keys: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """How errors name the key: `store.cap`, `mode`."""
        return f"{self.section}.{self.name}" if self.section else self.name


# ---- kinds -----------------------------------------------------------------------------------

PATH = Kind(parse_path)
SIZE = Kind(parse_size, format_size)
DURATION = Kind(parse_duration, format_duration)
MODE = Kind(parse_mode, format_mode)
BOOL = Kind(parse_bool)
GROUP = Kind(parse_group)
LOOPBACK = Kind(parse_loopback)
LISTEN = Kind(parse_listen)


def integer(low: int, high: int) -> Kind:
    """An integer in low..high."""

    def read(value: object, *, source: str, key: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(source, key, f"expected {low}..{high}, got {value!r}")
        return value

    return Kind(read)


def choice(values: tuple[str, ...], expected: str) -> Kind:
    """One of `values`; `expected` says which in the error."""

    def read(value: object, *, source: str, key: str) -> str:
        if value not in values:
            raise ConfigError(source, key, f"expected {expected}, got {value!r}")
        return str(value)

    return Kind(read)


def strings(reason: str, item_ok: Callable[[str], bool] = lambda _: True) -> Kind:
    """A list of strings that `item_ok` accepts, read as a tuple; `reason` is the error."""

    def read(value: object, *, source: str, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and item_ok(v) for v in value):
            raise ConfigError(source, key, reason)
        return tuple(value)

    return Kind(read)


def duration_of_at_least_1s(reason: Callable[[float], str], *, zero_is_off: bool = False) -> Kind:
    """A duration of at least a second (or 0, where 0 turns the thing off)."""

    def read(value: object, *, source: str, key: str) -> float:
        seconds = parse_duration(value, source=source, key=key)
        if seconds < 1 and not (zero_is_off and seconds == 0):
            raise ConfigError(source, key, reason(seconds))
        return seconds

    return Kind(read, format_duration)


def _read_system(value: object, *, source: str, key: str) -> bool:
    if value not in ("system", "user"):
        raise ConfigError(source, key, f"expected 'system' or 'user', got {value!r}")
    return value == "system"


def _read_cap(value: object, *, source: str, key: str) -> int | None:
    """A size; 0: no cap (None)."""
    return parse_size(value, source=source, key=key) or None


def _read_groups(value: object, *, source: str, key: str) -> tuple[str, ...]:
    groups: tuple[str, ...] = strings("must be a list of group names like 'ml-train'").read(
        value, source=source, key=key
    )
    for name in groups:
        try:
            grp.getgrnam(name)
        except KeyError:
            raise ConfigError(source, key, f"group {name!r} does not exist") from None
    return groups


def _read_rate(value: object, *, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e6:
        raise ConfigError(source, key, f"expected calls per minute 0..1e6, got {value!r}")
    return float(value)


def _read_prefetch(value: object, *, source: str, key: str) -> tuple[PrefetchEntry, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, "must be a list of 'org/name[:VERSION|@REV]'")
    return tuple(
        parse_prefetch_entry(str(t), source=source, key=f"{key}[{i}]") for i, t in enumerate(value)
    )


def _read_trusted_keys(value: object, *, source: str, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(source, key, "must map key names to public keys")
    return dict(value)


def _read_identities(value: object, *, source: str, key: str) -> tuple[ProvenanceIdentity, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, "must be a list of tables")
    return tuple(parse_identity(v, source=source, key=f"{key}[{i}]") for i, v in enumerate(value))


def _read_listen_or_off(value: object, *, source: str, key: str) -> str:
    """A loopback HOST:PORT, or "" (off)."""
    return "" if value == "" else parse_loopback(value, source=source, key=key)


# ---- the keys --------------------------------------------------------------------------------

_SYSTEM = Kind(_read_system, lambda system: "system" if system else "user")
_UPSTREAMS = Kind(read_upstreams, upstream_tables)
_CAP = Kind(_read_cap, lambda cap: format_size(cap or 0))
_SCRUB_INTERVAL = duration_of_at_least_1s(
    lambda s: f"must be 0 (off) or at least 1s, got {s}", zero_is_off=True
)
_FETCH_ALLOW = strings("must be a list of repo patterns like 'org/*'")
_PREFETCH_KERNELS = Kind(_read_prefetch, lambda entries: [prefetch_text(p) for p in entries])
_TORCH_VERSIONS = strings(
    "must be a list like ['2.12', '2.13']", lambda t: bool(re.fullmatch(r"\d+\.\d+", t))
)
_PREFETCH_INTERVAL = duration_of_at_least_1s(lambda s: f"must be at least 1s, got {s}")
_LOG_LEVEL = choice(LOG_LEVELS, "/".join(LOG_LEVELS))
_IDLE_TIMEOUT = duration_of_at_least_1s(lambda s: f"must be at least 1s, got {s:g}s")
_PUBLISHERS = choice(TRUST_MODES, "one of " + ", ".join(TRUST_MODES))
_TRUST_ALLOW = strings(
    "must be a list of repo patterns like 'org/*' or 'org/name'", lambda p: "/" in p
)
_POLICY = choice(PROVENANCE_POLICIES, "one of " + ", ".join(PROVENANCE_POLICIES))
_IDENTITIES = Kind(_read_identities, lambda ids: [i.as_toml() for i in ids])

#: Every key, in the order a file is checked in and a dump writes them: the top level first
#: (`mode` decides the defaults of the rest), then the tables; a dump writes the [[upstream]]
#: array of tables after them, as TOML requires.
KEYS: tuple[Key, ...] = (
    Key("", "mode", "system", _SYSTEM),
    Key("", "upstream", "upstreams", _UPSTREAMS, table_keys=UPSTREAM_KEYS),
    Key("store", "path", "store_path", PATH),
    Key("store", "cap", "cap_bytes", _CAP),
    Key("store", "min_free", "min_free_bytes", SIZE),
    Key("store", "gc_min_age", "gc_min_age_s", DURATION),
    Key("store", "orphan_grace", "orphan_grace_s", DURATION),
    Key("store", "scrub_interval", "scrub_interval_s", _SCRUB_INTERVAL),
    Key("store", "scrub_rate", "scrub_rate_bytes", SIZE),
    Key("store", "quarantine_max", "quarantine_max_bytes", SIZE),
    Key("sockets", "user", "user_socket.path", PATH),
    Key("sockets", "user_mode", "user_socket.mode", MODE),
    Key("sockets", "user_group", "user_socket.group", GROUP),
    Key("sockets", "admin", "admin_socket.path", PATH),
    Key("sockets", "admin_mode", "admin_socket.mode", MODE),
    Key("sockets", "admin_group", "admin_socket.group", GROUP),
    Key("resolve", "ref_ttl", "ref_ttl_s", DURATION),
    Key("resolve", "negative_ttl", "negative_ttl_s", DURATION),
    Key("resolve", "lease_ttl", "lease_ttl_s", DURATION),
    Key("resolve", "lease_max", "lease_max_s", DURATION),
    Key("resolve", "lease_limit_per_client", "lease_limit_per_client", integer(1, 1 << 24)),
    Key("resolve", "lease_limit", "lease_limit", integer(1, 1 << 24)),
    Key("fetch", "allow", "fetch_allow", _FETCH_ALLOW),
    Key("fetch", "timeout", "fetch_timeout_s", DURATION),
    Key("fetch", "attempts", "fetch_attempts", integer(1, 20)),
    Key("fetch", "allow_groups", "fetch_allow_groups", Kind(_read_groups)),
    Key("fetch", "per_uid_rate", "fetch_per_uid_rate", Kind(_read_rate, plain_number)),
    Key("fetch", "per_uid_burst", "fetch_per_uid_burst", integer(1, 100_000)),
    Key("prefetch", "kernels", "prefetch", _PREFETCH_KERNELS),
    Key("prefetch", "torch", "prefetch_torch", _TORCH_VERSIONS),
    Key("prefetch", "interval", "prefetch_interval_s", _PREFETCH_INTERVAL),
    Key("prefetch", "on_start", "prefetch_on_start", BOOL),
    Key("mirror", "trusted_keys", "trusted_keys", Kind(_read_trusted_keys, dict)),
    Key("metrics", "socket", "metrics_socket", PATH, optional=True),
    Key("metrics", "listen", "metrics_listen", LISTEN, optional=True),
    Key("metrics", "allow_remote", "metrics_allow_remote", BOOL),
    Key("metrics", "socket_mode", "metrics_socket_mode", MODE),
    Key("metrics", "socket_group", "metrics_socket_group", GROUP),
    Key("log", "level", "log_level", _LOG_LEVEL),
    Key("server", "drain_timeout", "drain_timeout_s", DURATION),
    Key("server", "threads", "threads", integer(1, 256)),
    Key("server", "max_connections", "max_connections", integer(1, 1 << 20)),
    Key("server", "admin_max_connections", "admin_max_connections", integer(1, 4096)),
    Key("server", "idle_timeout", "idle_timeout_s", _IDLE_TIMEOUT),
    # 0: 4 per thread (a short queue; kerneld/server/app.py QUEUE_FACTOR).
    Key("server", "max_concurrent_rpcs", "max_concurrent_rpcs", integer(0, 4096)),
    Key("server", "max_resolve_many", "max_resolve_many", integer(1, 100_000)),
    Key("trust", "publishers", "trust_publishers", _PUBLISHERS),
    Key("trust", "allow", "trust_allow", _TRUST_ALLOW),
    Key("trust", "ttl", "trust_ttl_s", DURATION),
    Key("trust", "honor_trust_remote_code", "trust_honor_remote_code", BOOL),
    Key("hub_api", "listen", "hub_api_listen", Kind(_read_listen_or_off)),
    Key("hub_api", "socket", "hub_api_socket", PATH, optional=True),
    Key("provenance", "policy", "provenance_policy", _POLICY),
    Key("provenance", "identities", "provenance_identities", _IDENTITIES),
    Key("provenance", "kernels_defaults", "provenance_kernels_defaults", BOOL),
    Key("provenance", "trusted_root", "provenance_trusted_root", PATH, optional=True),
)


def _by_section(keys: tuple[Key, ...]) -> dict[str, tuple[Key, ...]]:
    out: dict[str, list[Key]] = {}
    for key in keys:
        out.setdefault(key.section, []).append(key)
    return {section: tuple(members) for section, members in out.items()}


#: Section ("" for the top level) -> its keys, in table order.
SECTIONS: Mapping[str, tuple[Key, ...]] = _by_section(KEYS)

#: The names each table accepts: the top level's keys and sections, each section's keys, and
#: the keys of each table of an array of tables (`upstream`).
KNOWN_KEYS: Mapping[str, frozenset[str]] = {
    "": frozenset(k.name for k in SECTIONS[""]) | frozenset(s for s in SECTIONS if s),
    **{k.name: frozenset(k.table_keys) for k in SECTIONS[""] if k.table_keys},
    **{s: frozenset(k.name for k in keys) for s, keys in SECTIONS.items() if s},
}


def _field_keys() -> dict[str, str]:
    names: dict[str, list[Key]] = {}
    for key in KEYS:
        names.setdefault(key.field.partition(".")[0], []).append(key)
    out = {"source": "(config file)"}
    for field, keys in names.items():
        first = keys[0]
        if first.table_keys:
            out[field] = f"[[{first.name}]]"
        elif not first.section:
            out[field] = first.name
        else:
            out[field] = f"[{first.section}] " + "/".join(k.name for k in keys)
    return out


#: Config field -> the kerneld.toml key that sets it: what log lines and `ReloadConfig` answers
#: name, since an admin knows `[resolve] ref_ttl`, not `ref_ttl_s`.
FIELD_KEYS: Mapping[str, str] = _field_keys()


def config_key(field_name: str) -> str:
    """The kerneld.toml key of a Config field (the field's name if it has none)."""
    return FIELD_KEYS.get(field_name, field_name)
