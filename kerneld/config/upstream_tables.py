"""`[[upstream]]`: the array of tables that lists the upstreams, read and written whole.

Unlike the other keys, an entry's keys depend on each other: its `kind` decides which key holds
its location (`endpoint`, `path` or `url`), its default name, and whether it may require
signatures; and names must be unique across entries. So the key table (`schema.py`) has one key,
`upstream`, whose reader and writer are these.
"""

from __future__ import annotations

import re
from typing import Any

from kerneld.config.errors import ConfigError
from kerneld.config.model import UPSTREAM_KINDS, UpstreamConfig
from kerneld.config.values import parse_path, parse_str

#: The keys of one `[[upstream]]` table.
UPSTREAM_KEYS = ("name", "kind", "endpoint", "path", "url", "token_file", "require_signatures")
#: The key that holds an upstream's location, by kind.
LOCATION_KEYS = {"hub": "endpoint", "mirror-dir": "path", "mirror-http": "url"}


def read_upstreams(value: object, *, source: str, key: str) -> tuple[UpstreamConfig, ...]:
    """The `[[upstream]]` tables, in order (the order they are asked in). `upstream = []`: no
    upstream at all, an import-only host (kernels arrive only by `kerneldctl mirror import`);
    a file with no `upstream` key keeps the default, the Hub."""
    if not isinstance(value, list):
        raise ConfigError(
            source,
            key,
            "must be an array of tables ([[upstream]]), or `upstream = []` (at the top of the "
            "file, before any [section]) for an import-only host",
        )
    ups = tuple(
        _read_upstream(up, i, source=source, key=f"{key}[{i}]") for i, up in enumerate(value)
    )
    names = [u.name for u in ups]
    if len(set(names)) != len(names):
        raise ConfigError(source, key, f"upstream names must be unique, got {names}")
    return ups


def _read_upstream(up: object, index: int, *, source: str, key: str) -> UpstreamConfig:
    if not isinstance(up, dict):
        raise ConfigError(source, key, "must be a table")
    for name in up:
        if name not in UPSTREAM_KEYS:
            known = ", ".join(sorted(UPSTREAM_KEYS))
            raise ConfigError(source, f"{key}.{name}", f"unknown key (known: {known})")
    kind = up.get("kind")
    if kind not in UPSTREAM_KINDS:
        raise ConfigError(source, f"{key}.kind", f"expected one of {UPSTREAM_KINDS}, got {kind!r}")
    loc_key = LOCATION_KEYS[kind]
    location = up.get(loc_key, "")
    if kind != "hub":
        location = parse_str(location, source=source, key=f"{key}.{loc_key}")
        if kind == "mirror-dir":
            location = str(parse_path(location, source=source, key=f"{key}.path"))
    elif not isinstance(location, str):
        raise ConfigError(source, f"{key}.endpoint", f"expected a URL, got {location!r}")
    if kind != "mirror-dir" and location and not re.match(r"^https?://\S+$", location):
        raise ConfigError(
            source, f"{key}.{loc_key}", f"must start with http:// or https://, got {location!r}"
        )
    name = up.get("name") or (kind if kind == "hub" else f"{kind}-{index}")
    token_file = up.get("token_file")
    if token_file is not None:
        token_file = parse_path(token_file, source=source, key=f"{key}.token_file")
    signed = up.get("require_signatures", False)
    if not isinstance(signed, bool):
        raise ConfigError(
            source, f"{key}.require_signatures", f"expected true or false, got {signed!r}"
        )
    if signed and kind == "hub":
        raise ConfigError(
            source,
            f"{key}.require_signatures",
            "only mirror upstreams carry signatures (kerneldctl mirror export "
            "--sign-key); the Hub is authenticated by HTTPS",
        )
    return UpstreamConfig(
        parse_str(name, source=source, key=f"{key}.name"), kind, location, token_file, signed
    )


def upstream_tables(upstreams: tuple[UpstreamConfig, ...]) -> list[dict[str, Any]]:
    """The upstreams as `[[upstream]]` tables that `read_upstreams` reads back the same."""
    tables = []
    for up in upstreams:
        table: dict[str, Any] = {"name": up.name, "kind": up.kind}
        if up.location:
            table[LOCATION_KEYS[up.kind]] = up.location
        if up.token_file is not None:
            table["token_file"] = up.token_file
        if up.require_signatures:
            table["require_signatures"] = True
        tables.append(table)
    return tables
