"""kerneld's configuration: a TOML file, then `KERNELD_*` environment, then command-line flags.

With no file at all, `kerneld` runs in user mode for one user (store under ~/.cache/kerneld,
sockets under $XDG_RUNTIME_DIR/kerneld, the Hugging Face Hub as the only upstream). The system
service reads /etc/kerneld/kerneld.toml (see systemd/kerneld.toml for every key).

Every invalid value fails at start with the file, the key and the reason (`ConfigError`).

One table of keys (`schema.py`) drives reading (`parse.py`), writing back (`dump.py`) and the
generated reference; `model.py` holds the typed `Config` the daemon reads, with its defaults;
`values.py` the readers and writers of single values; `load.py` finds the file and applies the
environment.
"""

from kerneld.config.dump import dump_config, toml_literal
from kerneld.config.errors import ConfigError
from kerneld.config.load import apply_env, load_config
from kerneld.config.model import (
    DEFAULT_SCRUB_INTERVAL_S,
    DEFAULT_SCRUB_RATE,
    LOG_LEVELS,
    PROVENANCE_POLICIES,
    TRUST_MODES,
    UPSTREAM_KINDS,
    Config,
    PrefetchEntry,
    ProvenanceIdentity,
    SocketConfig,
    UpstreamConfig,
    default_config,
)
from kerneld.config.parse import check_metrics_listen, parse_config
from kerneld.config.schema import FIELD_KEYS, KEYS, KNOWN_KEYS, Key, config_key
from kerneld.config.values import (
    LOOPBACK_HOSTS,
    format_duration,
    format_size,
    is_loopback,
    parse_duration,
    parse_listen,
    parse_loopback,
    parse_mode,
    parse_prefetch_entry,
    parse_size,
)

__all__ = [
    "DEFAULT_SCRUB_INTERVAL_S",
    "DEFAULT_SCRUB_RATE",
    "FIELD_KEYS",
    "KEYS",
    "KNOWN_KEYS",
    "LOG_LEVELS",
    "LOOPBACK_HOSTS",
    "PROVENANCE_POLICIES",
    "TRUST_MODES",
    "UPSTREAM_KINDS",
    "Config",
    "ConfigError",
    "Key",
    "PrefetchEntry",
    "ProvenanceIdentity",
    "SocketConfig",
    "UpstreamConfig",
    "apply_env",
    "check_metrics_listen",
    "config_key",
    "default_config",
    "dump_config",
    "format_duration",
    "format_size",
    "is_loopback",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_listen",
    "parse_loopback",
    "parse_mode",
    "parse_prefetch_entry",
    "parse_size",
    "toml_literal",
]
