"""`Config` -> kerneld.toml text (`kerneld --check-config`), through the key table: what the
daemon will actually use, defaults included, written so that `load_config` reads it back to the
same values."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kerneld.config.model import Config
from kerneld.config.schema import SECTIONS


def toml_str(text: str) -> str:
    """A TOML basic string. Not `json.dumps`: JSON writes characters outside the BMP as
    surrogate-pair escapes, which TOML rejects, and leaves DEL unescaped, which TOML forbids."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_literal(value: object) -> str:
    """A TOML literal for the few value types a Config holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return toml_str(str(value))
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{toml_str(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _value(cfg: Config, field: str) -> Any:
    """`cfg.<field>`, where field may name a part of a nested value (`user_socket.mode`)."""
    value: Any = cfg
    for name in field.split("."):
        value = getattr(value, name)
    return value


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML that `load_config` reads back to the same values
    (`kerneld --check-config`): what the daemon will actually use, defaults included."""
    lines = [f"# kerneld configuration as resolved from {cfg.source}"]
    arrays: list[tuple[str, list[dict[str, Any]]]] = []  # written last, as TOML wants
    for section, keys in SECTIONS.items():
        if section:
            lines += ["", f"[{section}]"]
        for key in keys:
            value = _value(cfg, key.field)
            if key.optional and not value:
                continue
            written = key.kind.write(value)
            if key.table_keys:
                assert isinstance(written, list)
                if written:
                    arrays.append((key.name, written))
                else:  # `upstream = []`: top-level, so before the first [section]
                    lines.append(f"{key.name} = []")
            else:
                lines.append(f"{key.name} = {toml_literal(written)}")
    for name, tables in arrays:
        for table in tables:
            lines += ["", f"[[{name}]]"]
            lines.extend(f"{k} = {toml_literal(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"
