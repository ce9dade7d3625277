"""What a config reload changes: the settings applied now, and those that wait for a restart.

`kerneldctl reload` (and SIGHUP) hands the daemon a new `Config`; `config_change` compares it
with the running one. Settings in `RESTART_FIELDS` (sockets, the store's path, thread and
connection limits) are fixed at start: the reload reports them and keeps their old values.
`Core.apply_config` applies the rest to the components that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kerneld.config import Config

#: Config fields that only take effect at the next start.
RESTART_FIELDS: tuple[str, ...] = (
    "store_path",
    "user_socket",
    "admin_socket",
    "metrics_socket",
    "metrics_socket_mode",
    "metrics_socket_group",
    "metrics_listen",
    "metrics_allow_remote",
    "hub_api_listen",
    "hub_api_socket",
    "threads",
    "max_connections",
    "admin_max_connections",
    "idle_timeout_s",
    "max_concurrent_rpcs",
    "system",
)


@dataclass(frozen=True)
class ConfigChange:
    applied: list[str]
    """Changed settings that take effect now."""
    restart: list[str]
    """Changed settings that only take effect at the next start."""
    effective: Config
    """The new config, with the restart-only settings kept at their running values."""

    def touches(self, *names: str, prefixes: tuple[str, ...] = ()) -> bool:
        """Whether an applied setting is one of `names` or starts with one of `prefixes`."""
        return any(c in names or c.startswith(prefixes) for c in self.applied)


def config_change(old: Config, new: Config) -> ConfigChange:
    """What switching from `old` to `new` changes (`source`, the file it came from, is not a
    setting)."""
    changed = [f.name for f in fields(Config) if getattr(old, f.name) != getattr(new, f.name)]
    changed = [c for c in changed if c != "source"]
    restart = [c for c in changed if c in RESTART_FIELDS]
    applied = [c for c in changed if c not in RESTART_FIELDS]
    keep = {name: getattr(old, name) for name in restart}
    return ConfigChange(applied, restart, replace(new, **keep))
