"""Where the daemon's settings come from: the file (`path`, $KERNELD_CONFIG, or the system or
user file), then the `KERNELD_*` variables that override it (read by `environment.py`; the
command-line flags are applied by kerneld/server/main.py on top)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kerneld.config.environment import ENV_LOG_LEVEL, Environment
from kerneld.config.errors import ConfigError
from kerneld.config.model import LOG_LEVELS, Config, default_config
from kerneld.config.parse import parse_config
from kerneld_client import locations

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def apply_env(cfg: Config, env: Environment) -> Config:
    """`KERNELD_STORE`, `KERNELD_SOCKET`, `KERNELD_ADMIN_SOCKET`, `KERNELD_LOG_LEVEL` override."""
    updates: dict[str, Any] = {}
    if env.store:
        updates["store_path"] = env.store
    if env.user_socket:
        updates["user_socket"] = replace(cfg.user_socket, path=env.user_socket)
    if env.admin_socket:
        updates["admin_socket"] = replace(cfg.admin_socket, path=env.admin_socket)
    if env.log_level:
        updates["log_level"] = _env_level(env.log_level)
    return replace(cfg, **updates)


def _env_level(value: str) -> str:
    if value not in LOG_LEVELS:
        raise ConfigError(
            "environment", ENV_LOG_LEVEL, f"expected debug/info/warning/error, got {value!r}"
        )
    return value


def load_config(
    path: Path | None = None, *, env: Mapping[str, str] | None = None, system: bool | None = None
) -> Config:
    """Load the config: `path`, else $KERNELD_CONFIG, else the system or user file if present."""
    environment = Environment.read(env)
    if path is None and environment.config_file:
        path = environment.config_file
    if system is None:
        system = os.geteuid() == 0 and path is None and locations.SYSTEM_CONFIG_FILE.exists()
    if path is None:
        candidate = locations.SYSTEM_CONFIG_FILE if system else locations.user_config_file()
        path = candidate if candidate.exists() else None
    if path is None:
        return apply_env(default_config(system=system), environment)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), "(file)", f"cannot read: {exc.strerror or exc}") from exc
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), "(file)", f"not valid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(str(path), "(file)", "not valid TOML: nested too deeply") from None
    return apply_env(parse_config(doc, source=str(path), system=system), environment)
