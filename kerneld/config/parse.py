"""A parsed TOML document -> `Config`, through the key table: every key is checked to be known,
read by its kind (which validates it), and set on the defaults of the document's mode; the
checks that span keys come last."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kerneld.config.errors import ConfigError
from kerneld.config.model import Config, default_config
from kerneld.config.schema import KNOWN_KEYS, SECTIONS
from kerneld.config.values import is_loopback


def parse_config(doc: Mapping[str, Any], *, source: str, system: bool) -> Config:
    """Turn a parsed TOML document into a Config (validating every key)."""
    updates: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}  # nested field -> {its attribute: value}
    for section, keys in SECTIONS.items():
        table = _table(doc, section, source)
        for key in keys:
            if key.name in table:
                value = key.kind.read(table[key.name], source=source, key=key.where)
                field, _, part = key.field.partition(".")
                if part:
                    parts.setdefault(field, {})[part] = value
                else:
                    updates[field] = value
    # `mode` decides the defaults of everything the document leaves out.
    cfg = replace(default_config(system=updates.get("system", system)), source=source)
    for field, values in parts.items():
        updates[field] = replace(getattr(cfg, field), **values)
    cfg = replace(cfg, **updates)
    _check_across_keys(cfg, source)
    return cfg


def _table(doc: Mapping[str, Any], section: str, source: str) -> Mapping[str, Any]:
    """The document (section "") or one of its tables, its keys all known."""
    table = doc if not section else doc.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(source, section, "must be a table")
    known = KNOWN_KEYS[section]
    for name in table:
        if name not in known:
            where = f"{section}.{name}" if section else name
            raise ConfigError(source, where, f"unknown key (known: {', '.join(sorted(known))})")
    return table


def check_metrics_listen(cfg: Config, source: str, key: str = "metrics.listen") -> None:
    """A metrics listener off loopback only when asked for: anyone who reaches it reads them."""
    if cfg.metrics_listen and not cfg.metrics_allow_remote and not is_loopback(cfg.metrics_listen):
        raise ConfigError(
            source,
            key,
            f"{cfg.metrics_listen!r} is not a loopback address: metrics are served to other "
            "hosts only with [metrics] allow_remote = true (no authentication: anyone who can "
            "reach that address reads them; firewall it to the scraper)",
        )


def _check_across_keys(cfg: Config, source: str) -> None:
    check_metrics_listen(cfg, source)
    if cfg.lease_ttl_s > cfg.lease_max_s:
        raise ConfigError(
            source,
            "resolve.lease_ttl",
            f"{cfg.lease_ttl_s:g}s is longer than resolve.lease_max ({cfg.lease_max_s:g}s)",
        )
    if cfg.lease_ttl_s <= 0:
        raise ConfigError(source, "resolve.lease_ttl", "must be longer than 0s")
