"""Every environment variable the daemon and `kerneldctl` read, read here and nowhere else.

The `KERNELD_*` overrides of kerneld.toml, the admin's key directory, and systemd's own protocol
variables (readiness, watchdog, journal). A caller takes an `Environment` (read once, or from
the mapping a test passes) instead of reaching for `os.environ`, so what kerneld depends on is
one list. The client library has its own one module, `kerneld_client._config`; the socket and
store variables are spelt there once and shared.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from kerneld_client import locations

#: Load the config: `--config`, else $KERNELD_CONFIG, else the system or user file if present.
ENV_CONFIG = "KERNELD_CONFIG"
#: kerneld's modules log for the daemon's journal; in kerneldctl their outcome is already reported
#: by the command, so only errors pass unless $KERNELD_LOG_LEVEL asks for more.
ENV_LOG_LEVEL = "KERNELD_LOG_LEVEL"
#: $KERNELD_KEY_DIR, else /etc/kerneld/keys for root on a system install (kerneld.toml there),
#: else ~/.config/kerneld/keys.
ENV_KEY_DIR = "KERNELD_KEY_DIR"


def _path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name)
    return Path(value) if value else None


@dataclass(frozen=True)
class Environment:
    """What the environment says, as kerneld reads it (empty values count as unset)."""

    config_file: Path | None = None
    store: Path | None = None
    user_socket: Path | None = None
    admin_socket: Path | None = None
    log_level: str | None = None
    key_dir: Path | None = None
    notify_socket: str | None = None
    watchdog_usec: str | None = None
    watchdog_pid: str | None = None
    journal_stream: str | None = None
    invocation_id: str | None = None

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> Environment:
        """The process's environment now, or `env` (tests, and the daemon's own snapshot)."""
        env = os.environ if env is None else env
        return cls(
            config_file=_path(env, ENV_CONFIG),
            store=_path(env, locations.ENV_STORE),
            user_socket=_path(env, locations.ENV_SOCKET),
            admin_socket=_path(env, locations.ENV_ADMIN_SOCKET),
            log_level=env.get(ENV_LOG_LEVEL) or None,
            key_dir=_path(env, ENV_KEY_DIR),
            notify_socket=env.get("NOTIFY_SOCKET") or None,
            watchdog_usec=env.get("WATCHDOG_USEC") or None,
            watchdog_pid=env.get("WATCHDOG_PID") or None,
            journal_stream=env.get("JOURNAL_STREAM") or None,
            invocation_id=env.get("INVOCATION_ID") or None,
        )

    @property
    def under_systemd(self) -> bool:
        """Started by systemd (its stderr goes to the journal)."""
        return bool(self.journal_stream or self.invocation_id)


#: systemd's socket activation protocol (sd_listen_fds(3)).
LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def take_listen_variables(environ: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
    """`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`, removed from the environment as they are
    read (as sd_listen_fds does with unset_environment: no child of the daemon sees them)."""
    env = os.environ if environ is None else environ
    return {name: env.pop(name, None) for name in LISTEN_VARIABLES}
