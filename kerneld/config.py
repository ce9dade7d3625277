"""kerneld's configuration: a TOML file, then `KERNELD_*` environment, then command-line flags.

With no file at all, `kerneld` runs in user mode for one user (store under ~/.cache/kerneld,
sockets under $XDG_RUNTIME_DIR/kerneld, the Hugging Face Hub as the only upstream). The system
service reads /etc/kerneld/kerneld.toml (see systemd/kerneld.toml for every key).

Every invalid value fails at start with the file, the key and the reason (`ConfigError`).
"""

from __future__ import annotations

import contextlib
import grp
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kerneld.store.verify import DEFAULT_QUARANTINE_MAX_BYTES
from kerneld.upstream.base import check_repo_id
from kerneld_client import locations
from kerneld_client._index import repo_matches

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UPSTREAM_KINDS = ("hub", "mirror-dir", "mirror-http")
#: The periodic scrub: weekly, at 32 MiB/s (a 20 GiB store takes about 11 minutes of reads).
DEFAULT_SCRUB_INTERVAL_S = 7 * 86400.0
DEFAULT_SCRUB_RATE = 32 << 20


class ConfigError(ValueError):
    """An invalid configuration: says where (file and key) and why."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        super().__init__(f"{source}: {key}: {reason}")


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


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    kind: str  # hub | mirror-dir | mirror-http
    location: str = ""  # endpoint (hub, empty: HF_ENDPOINT or huggingface.co), directory or URL
    token_file: Path | None = None
    require_signatures: bool = False  # mirrors: refs and manifests signed by [mirror] trusted_keys


@dataclass(frozen=True)
class SocketConfig:
    path: Path
    mode: int
    group: str = ""  # empty: keep the daemon's group


@dataclass(frozen=True)
class PrefetchEntry:
    repo_id: str
    version: int | None = None
    revision: str | None = None


@dataclass(frozen=True)
class ProvenanceIdentity:
    """A signer the site trusts (`[provenance] identities`): an OIDC `identity` + `issuer` (as
    `sigstore verify identity`), or a GitHub `repository` + its build `workflows` (as kernels'
    own policy for kernels-community)."""

    identity: str = ""
    issuer: str = ""
    repository: str = ""
    workflows: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.repository:
            return f"workflows of github.com/{self.repository}"
        return f"{self.identity} (issuer {self.issuer})"

    def as_toml(self) -> dict[str, object]:
        if self.repository:
            return {"repository": self.repository, "workflows": list(self.workflows)}
        return {"identity": self.identity, "issuer": self.issuer}


PROVENANCE_POLICIES = ("off", "warn", "require")


@dataclass(frozen=True)
class Config:
    """Everything the daemon needs, resolved to concrete values."""

    source: str
    system: bool
    store_path: Path
    cap_bytes: int | None = None
    min_free_bytes: int = 1 << 30
    gc_min_age_s: float = 3600.0
    orphan_grace_s: float = 3600.0
    scrub_interval_s: float = DEFAULT_SCRUB_INTERVAL_S
    """Seconds between background re-hashes of the whole store; 0: never."""
    scrub_rate_bytes: int = DEFAULT_SCRUB_RATE
    """Bytes per second a scrub may read; 0: as fast as the disk goes."""
    quarantine_max_bytes: int = DEFAULT_QUARANTINE_MAX_BYTES
    """Bytes the quarantine may hold; over it the oldest entries are dropped; 0: no bound."""
    user_socket: SocketConfig = field(
        default_factory=lambda: SocketConfig(locations.user_run_dir() / "kerneld.sock", 0o666)
    )
    admin_socket: SocketConfig = field(
        default_factory=lambda: SocketConfig(locations.user_run_dir() / "admin.sock", 0o600)
    )
    upstreams: tuple[UpstreamConfig, ...] = (UpstreamConfig("hub", "hub"),)
    ref_ttl_s: float = 300.0
    negative_ttl_s: float = 30.0
    lease_ttl_s: float = 600.0
    lease_max_s: float = 86400.0
    lease_limit_per_client: int = 1024
    """Unexpired leases one `client` value keeps; its oldest beyond are dropped."""
    lease_limit: int = 65536
    """Unexpired leases the store keeps in all (`client` is self-reported: one caller may use
    many names)."""
    fetch_allow: tuple[str, ...] = ("*",)
    fetch_timeout_s: float = 10.0
    fetch_attempts: int = 4
    fetch_allow_groups: tuple[str, ...] = ()
    """Groups whose members' calls may trigger downloads; empty: every caller (anonymous too)."""
    fetch_per_uid_rate: float = 60.0
    """Fetch-triggering calls per minute one uid may make (anonymous callers share one
    budget); 0: no limit. The daemon's own uid and root are not limited."""
    fetch_per_uid_burst: int = 60
    prefetch: tuple[PrefetchEntry, ...] = ()
    prefetch_torch: tuple[str, ...] = ()
    prefetch_interval_s: float = 6 * 3600.0
    prefetch_on_start: bool = True
    trusted_keys: Mapping[str, str] = field(default_factory=dict)
    metrics_socket: Path | None = None
    metrics_socket_mode: int = 0o660
    metrics_socket_group: str = ""
    """Who may scrape the metrics socket; empty: the daemon's own group."""
    metrics_listen: str = ""
    log_level: str = "info"
    drain_timeout_s: float = 20.0
    threads: int = 16
    max_connections: int = 1024
    """Connections the user socket holds at once; more are closed at accept (fds stay free)."""
    admin_max_connections: int = 64
    idle_timeout_s: float = 60.0
    """A connection without a call for this long is closed (clients use one per call)."""
    max_concurrent_rpcs: int = 0
    """RPCs the user socket admits at once, the rest RESOURCE_EXHAUSTED; 0: 4 x `threads`."""
    max_resolve_many: int = 256
    trust_publishers: str = "hub"
    """Whose kernels jobs get: "hub" (the Hub's trusted kernel publishers, and `trust_allow`),
    "allow-list" (`trust_allow` only: air-gapped sites), "any" (every publisher; kerneld before
    the check, and what `trust_remote_code=True` asks for in `kernels`)."""
    trust_allow: tuple[str, ...] = ()
    """Repo patterns ('org/*', 'org/name') trusted whatever the Hub says."""
    trust_ttl_s: float = 3600.0
    """How long the Hub's answer about an organisation is used before it is asked again."""
    trust_honor_remote_code: bool = True
    """May a job's `trust_remote_code` accept an untrusted publisher (as in `kernels`)?"""
    hub_api_listen: str = ""
    """Loopback HOST:PORT of the Hub-compatible HTTP endpoint (`HF_ENDPOINT` for unmodified
    `kernels`); empty: off. Only users who may use the user socket get answers."""
    hub_api_socket: Path | None = None
    """A unix socket for the same endpoint, with the user socket's mode and group."""
    provenance_policy: str = "warn"
    """Sigstore bundles (metadata.json.sigstore) checked when a tree enters the store: "off"
    (not checked), "warn" (checked and recorded; a bad signature is logged, the kernel served),
    "require" (only kernels signed by a trusted identity enter the store or are served)."""
    provenance_identities: tuple[ProvenanceIdentity, ...] = ()
    """Signers trusted besides kernels' own (kernels-community's build workflows)."""
    provenance_kernels_defaults: bool = True
    """Trust the signers `kernels` trusts by default (kernels.verify.DEFAULT_POLICIES)?"""
    provenance_trusted_root: Path | None = None
    """A Sigstore trusted_root.json (a private Sigstore instance, or an air-gapped site's copy);
    unset: Sigstore's public-good instance (refreshed over TUF, else the copy sigstore ships)."""

    def publisher_allowed(self, repo_id: str) -> bool:
        """Is `repo_id` trusted by `[trust] allow` alone?"""
        return any(repo_matches(repo_id, pat) for pat in self.trust_allow)

    def fetch_allowed(self, repo_id: str) -> bool:
        """May an unprivileged client's Resolve trigger a download of `repo_id`?"""
        return any(repo_matches(repo_id, pat) for pat in self.fetch_allow)

    def fetch_allow_gids(self) -> frozenset[int] | None:
        """`[fetch] allow_groups` as gids (a group deleted since the config was read admits
        no one); None: no group restriction."""
        if not self.fetch_allow_groups:
            return None
        gids = set()
        for name in self.fetch_allow_groups:
            with contextlib.suppress(KeyError):
                gids.add(grp.getgrnam(name).gr_gid)
        return frozenset(gids)


def default_config(*, system: bool) -> Config:
    if system:
        run = locations.SYSTEM_RUN_DIR
        return Config(
            source="(defaults, system mode)",
            system=True,
            store_path=locations.SYSTEM_STORE,
            user_socket=SocketConfig(run / locations.SOCKET_NAME, 0o660, "kerneld-users"),
            admin_socket=SocketConfig(run / locations.ADMIN_SOCKET_NAME, 0o660, "kerneld-admin"),
            # The admins who run kerneldctl may also scrape (`curl --unix-socket ...`).
            metrics_socket_group="kerneld-admin",
        )
    run = locations.user_run_dir()
    return Config(
        source="(defaults, user mode)",
        system=False,
        store_path=locations.user_cache_dir() / "store",
        user_socket=SocketConfig(run / locations.SOCKET_NAME, 0o600),
        admin_socket=SocketConfig(run / locations.ADMIN_SOCKET_NAME, 0o600),
    )


#: The `[server]` integer limits: (key, Config field, lowest, highest). max_concurrent_rpcs 0
#: means "4 per thread" (a short queue; kerneld/server/app.py QUEUE_FACTOR).
SERVER_LIMITS: tuple[tuple[str, str, int, int], ...] = (
    ("max_connections", "max_connections", 1, 1 << 20),
    ("admin_max_connections", "admin_max_connections", 1, 4096),
    ("max_concurrent_rpcs", "max_concurrent_rpcs", 0, 4096),
    ("max_resolve_many", "max_resolve_many", 1, 100_000),
)

_KNOWN: dict[str, set[str]] = {
    "": {
        "store",
        "sockets",
        "upstream",
        "resolve",
        "fetch",
        "prefetch",
        "mirror",
        "metrics",
        "log",
        "server",
        "trust",
        "hub_api",
        "provenance",
        "mode",
    },
    "store": {
        "path",
        "cap",
        "min_free",
        "gc_min_age",
        "orphan_grace",
        "scrub_interval",
        "scrub_rate",
        "quarantine_max",
    },
    "sockets": {"user", "admin", "user_mode", "admin_mode", "user_group", "admin_group"},
    "upstream": {"name", "kind", "endpoint", "path", "url", "token_file", "require_signatures"},
    "resolve": {
        "ref_ttl",
        "negative_ttl",
        "lease_ttl",
        "lease_max",
        "lease_limit_per_client",
        "lease_limit",
    },
    "fetch": {"allow", "timeout", "attempts", "allow_groups", "per_uid_rate", "per_uid_burst"},
    "prefetch": {"kernels", "torch", "interval", "on_start"},
    "mirror": {"trusted_keys"},
    "metrics": {"socket", "socket_mode", "socket_group", "listen"},
    "log": {"level"},
    "trust": {"publishers", "allow", "ttl", "honor_trust_remote_code"},
    "provenance": {"policy", "identities", "kernels_defaults", "trusted_root"},
    "hub_api": {"listen", "socket"},
    "server": {
        "drain_timeout",
        "threads",
        "max_connections",
        "admin_max_connections",
        "idle_timeout",
        "max_concurrent_rpcs",
        "max_resolve_many",
    },
}


def _check_keys(
    table: Mapping[str, Any], section: str, source: str, where_prefix: str | None = None
) -> None:
    prefix = section if where_prefix is None else where_prefix
    for key in table:
        if key not in _KNOWN[section]:
            where = f"{prefix}.{key}" if prefix else key
            known = ", ".join(sorted(_KNOWN[section]))
            raise ConfigError(source, where, f"unknown key (known: {known})")


def _table(doc: Mapping[str, Any], name: str, source: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(source, name, "must be a table")
    _check_keys(value, name, source)
    return value


def _bool(value: object, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, f"expected true or false, got {value!r}")
    return value


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


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


def _str(value: object, source: str, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(source, key, f"expected a non-empty string, got {value!r}")
    return value


def _path(value: object, source: str, key: str) -> Path:
    """A non-empty path without NUL bytes (no file system call can take one)."""
    text = _str(value, source, key)
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


def parse_config(doc: Mapping[str, Any], *, source: str, system: bool) -> Config:
    """Turn a parsed TOML document into a Config (validating every key)."""
    _check_keys(doc, "", source)
    mode = doc.get("mode")
    if mode is not None:
        if mode not in ("system", "user"):
            raise ConfigError(source, "mode", f"expected 'system' or 'user', got {mode!r}")
        system = mode == "system"
    cfg = replace(default_config(system=system), source=source)
    updates: dict[str, Any] = {}

    store = _table(doc, "store", source)
    if "path" in store:
        updates["store_path"] = _path(store["path"], source, "store.path")
    if "cap" in store:
        updates["cap_bytes"] = parse_size(store["cap"], source=source, key="store.cap") or None
    if "min_free" in store:
        updates["min_free_bytes"] = parse_size(
            store["min_free"], source=source, key="store.min_free"
        )
    if "gc_min_age" in store:
        updates["gc_min_age_s"] = parse_duration(
            store["gc_min_age"], source=source, key="store.gc_min_age"
        )
    if "orphan_grace" in store:
        updates["orphan_grace_s"] = parse_duration(
            store["orphan_grace"], source=source, key="store.orphan_grace"
        )
    if "scrub_interval" in store:
        interval = parse_duration(
            store["scrub_interval"], source=source, key="store.scrub_interval"
        )
        if 0 < interval < 1:
            raise ConfigError(
                source, "store.scrub_interval", f"must be 0 (off) or at least 1s, got {interval}"
            )
        updates["scrub_interval_s"] = interval
    if "scrub_rate" in store:
        updates["scrub_rate_bytes"] = parse_size(
            store["scrub_rate"], source=source, key="store.scrub_rate"
        )
    if "quarantine_max" in store:
        updates["quarantine_max_bytes"] = parse_size(
            store["quarantine_max"], source=source, key="store.quarantine_max"
        )

    sockets = _table(doc, "sockets", source)
    for which in ("user", "admin"):
        current: SocketConfig = getattr(cfg, f"{which}_socket")
        path = sockets.get(which)
        mode_v = sockets.get(f"{which}_mode")
        group = sockets.get(f"{which}_group")
        if group is not None and not isinstance(group, str):
            raise ConfigError(
                source, f"sockets.{which}_group", f"expected a group name, got {group!r}"
            )
        updates[f"{which}_socket"] = SocketConfig(
            _path(path, source, f"sockets.{which}") if path is not None else current.path,
            parse_mode(mode_v, source=source, key=f"sockets.{which}_mode")
            if mode_v is not None
            else current.mode,
            group if isinstance(group, str) else current.group,
        )

    raw_upstreams = doc.get("upstream")
    if raw_upstreams is not None:
        if not isinstance(raw_upstreams, list) or not raw_upstreams:
            raise ConfigError(
                source, "upstream", "must be a non-empty array of tables ([[upstream]])"
            )
        ups: list[UpstreamConfig] = []
        for i, up in enumerate(raw_upstreams):
            key = f"upstream[{i}]"
            if not isinstance(up, dict):
                raise ConfigError(source, key, "must be a table")
            _check_keys(up, "upstream", source, key)
            kind = up.get("kind")
            if kind not in UPSTREAM_KINDS:
                raise ConfigError(
                    source, f"{key}.kind", f"expected one of {UPSTREAM_KINDS}, got {kind!r}"
                )
            loc_key = {"hub": "endpoint", "mirror-dir": "path", "mirror-http": "url"}[kind]
            location = up.get(loc_key, "")
            if kind != "hub":
                location = _str(location, source, f"{key}.{loc_key}")
                if kind == "mirror-dir":
                    location = str(_path(location, source, f"{key}.path"))
            elif not isinstance(location, str):
                raise ConfigError(source, f"{key}.endpoint", f"expected a URL, got {location!r}")
            if kind != "mirror-dir" and location and not re.match(r"^https?://\S+$", location):
                raise ConfigError(
                    source,
                    f"{key}.{loc_key}",
                    f"must start with http:// or https://, got {location!r}",
                )
            name = up.get("name") or (kind if kind == "hub" else f"{kind}-{i}")
            token_file = up.get("token_file")
            if token_file is not None:
                token_file = str(_path(token_file, source, f"{key}.token_file"))
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
            ups.append(
                UpstreamConfig(
                    _str(name, source, f"{key}.name"),
                    kind,
                    location,
                    Path(token_file) if isinstance(token_file, str) else None,
                    signed,
                )
            )
        names = [u.name for u in ups]
        if len(set(names)) != len(names):
            raise ConfigError(source, "upstream", f"upstream names must be unique, got {names}")
        updates["upstreams"] = tuple(ups)

    resolve = _table(doc, "resolve", source)
    for key, attr in (
        ("ref_ttl", "ref_ttl_s"),
        ("negative_ttl", "negative_ttl_s"),
        ("lease_ttl", "lease_ttl_s"),
        ("lease_max", "lease_max_s"),
    ):
        if key in resolve:
            updates[attr] = parse_duration(resolve[key], source=source, key=f"resolve.{key}")
    for key in ("lease_limit_per_client", "lease_limit"):
        if key in resolve:
            value = resolve[key]
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 24:
                raise ConfigError(source, f"resolve.{key}", f"expected 1..16777216, got {value!r}")
            updates[key] = value

    fetch = _table(doc, "fetch", source)
    if "allow" in fetch:
        allow = fetch["allow"]
        if not isinstance(allow, list) or not all(isinstance(p, str) for p in allow):
            raise ConfigError(source, "fetch.allow", "must be a list of repo patterns like 'org/*'")
        updates["fetch_allow"] = tuple(allow)
    if "timeout" in fetch:
        updates["fetch_timeout_s"] = parse_duration(
            fetch["timeout"], source=source, key="fetch.timeout"
        )
    if "attempts" in fetch:
        attempts = fetch["attempts"]
        if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= 20:
            raise ConfigError(source, "fetch.attempts", f"expected 1..20, got {attempts!r}")
        updates["fetch_attempts"] = attempts
    if "allow_groups" in fetch:
        groups = fetch["allow_groups"]
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ConfigError(
                source, "fetch.allow_groups", "must be a list of group names like 'ml-train'"
            )
        for name in groups:
            try:
                grp.getgrnam(name)
            except KeyError:
                raise ConfigError(
                    source, "fetch.allow_groups", f"group {name!r} does not exist"
                ) from None
        updates["fetch_allow_groups"] = tuple(groups)
    if "per_uid_rate" in fetch:
        rate = fetch["per_uid_rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1e6:
            raise ConfigError(
                source, "fetch.per_uid_rate", f"expected calls per minute 0..1e6, got {rate!r}"
            )
        updates["fetch_per_uid_rate"] = float(rate)
    if "per_uid_burst" in fetch:
        burst = fetch["per_uid_burst"]
        if not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= 100000:
            raise ConfigError(source, "fetch.per_uid_burst", f"expected 1..100000, got {burst!r}")
        updates["fetch_per_uid_burst"] = burst

    prefetch = _table(doc, "prefetch", source)
    if "kernels" in prefetch:
        items = prefetch["kernels"]
        if not isinstance(items, list):
            raise ConfigError(
                source, "prefetch.kernels", "must be a list of 'org/name[:VERSION|@REV]'"
            )
        updates["prefetch"] = tuple(
            parse_prefetch_entry(str(t), source=source, key=f"prefetch.kernels[{i}]")
            for i, t in enumerate(items)
        )
    if "torch" in prefetch:
        torch = prefetch["torch"]
        if not isinstance(torch, list) or not all(
            isinstance(t, str) and re.fullmatch(r"\d+\.\d+", t) for t in torch
        ):
            raise ConfigError(source, "prefetch.torch", "must be a list like ['2.12', '2.13']")
        updates["prefetch_torch"] = tuple(torch)
    if "interval" in prefetch:
        interval = parse_duration(prefetch["interval"], source=source, key="prefetch.interval")
        if interval < 1:
            raise ConfigError(source, "prefetch.interval", f"must be at least 1s, got {interval}")
        updates["prefetch_interval_s"] = interval
    if "on_start" in prefetch:
        updates["prefetch_on_start"] = _bool(prefetch["on_start"], source, "prefetch.on_start")

    mirror = _table(doc, "mirror", source)
    if "trusted_keys" in mirror:
        keys = mirror["trusted_keys"]
        if not isinstance(keys, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in keys.items()
        ):
            raise ConfigError(source, "mirror.trusted_keys", "must map key names to public keys")
        updates["trusted_keys"] = dict(keys)

    metrics = _table(doc, "metrics", source)
    if "socket" in metrics:
        updates["metrics_socket"] = _path(metrics["socket"], source, "metrics.socket")
    if "socket_mode" in metrics:
        updates["metrics_socket_mode"] = parse_mode(
            metrics["socket_mode"], source=source, key="metrics.socket_mode"
        )
    if "socket_group" in metrics:
        group = metrics["socket_group"]
        if not isinstance(group, str):
            raise ConfigError(
                source, "metrics.socket_group", f"expected a group name, got {group!r}"
            )
        updates["metrics_socket_group"] = group
    if "listen" in metrics:
        updates["metrics_listen"] = parse_loopback(
            metrics["listen"], source=source, key="metrics.listen"
        )

    log = _table(doc, "log", source)
    if "level" in log:
        level = log["level"]
        if level not in ("debug", "info", "warning", "error"):
            raise ConfigError(
                source, "log.level", f"expected debug/info/warning/error, got {level!r}"
            )
        updates["log_level"] = level

    server = _table(doc, "server", source)
    if "drain_timeout" in server:
        updates["drain_timeout_s"] = parse_duration(
            server["drain_timeout"], source=source, key="server.drain_timeout"
        )
    if "threads" in server:
        threads = server["threads"]
        if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 256:
            raise ConfigError(source, "server.threads", f"expected 1..256, got {threads!r}")
        updates["threads"] = threads
    for key, field_name, low, high in SERVER_LIMITS:
        if key in server:
            value = server[key]
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(source, f"server.{key}", f"expected {low}..{high}, got {value!r}")
            updates[field_name] = value
    if "idle_timeout" in server:
        idle = parse_duration(server["idle_timeout"], source=source, key="server.idle_timeout")
        if idle < 1.0:
            raise ConfigError(source, "server.idle_timeout", f"must be at least 1s, got {idle:g}s")
        updates["idle_timeout_s"] = idle

    updates.update(_parse_trust(_table(doc, "trust", source), source))
    updates.update(_parse_provenance(_table(doc, "provenance", source), source))

    hub_api = _table(doc, "hub_api", source)
    if "listen" in hub_api:
        listen = hub_api["listen"]
        updates["hub_api_listen"] = (
            "" if listen == "" else parse_loopback(listen, source=source, key="hub_api.listen")
        )
    if "socket" in hub_api:
        updates["hub_api_socket"] = _path(hub_api["socket"], source, "hub_api.socket")

    out = replace(cfg, **updates)
    if out.lease_ttl_s > out.lease_max_s:
        raise ConfigError(
            source,
            "resolve.lease_ttl",
            f"{out.lease_ttl_s:g}s is longer than resolve.lease_max ({out.lease_max_s:g}s)",
        )
    if out.lease_ttl_s <= 0:
        raise ConfigError(source, "resolve.lease_ttl", "must be longer than 0s")
    return out


TRUST_MODES = ("hub", "allow-list", "any")


def _parse_trust(trust: Mapping[str, Any], source: str) -> dict[str, Any]:
    updates: dict[str, Any] = {}
    if "publishers" in trust:
        mode = trust["publishers"]
        if mode not in TRUST_MODES:
            known = ", ".join(TRUST_MODES)
            raise ConfigError(source, "trust.publishers", f"expected one of {known}, got {mode!r}")
        updates["trust_publishers"] = mode
    if "allow" in trust:
        allow = trust["allow"]
        if not isinstance(allow, list) or not all(isinstance(p, str) and "/" in p for p in allow):
            raise ConfigError(
                source, "trust.allow", "must be a list of repo patterns like 'org/*' or 'org/name'"
            )
        updates["trust_allow"] = tuple(allow)
    if "ttl" in trust:
        updates["trust_ttl_s"] = parse_duration(trust["ttl"], source=source, key="trust.ttl")
    if "honor_trust_remote_code" in trust:
        updates["trust_honor_remote_code"] = _bool(
            trust["honor_trust_remote_code"], source, "trust.honor_trust_remote_code"
        )
    return updates


def _parse_identity(value: object, source: str, key: str) -> ProvenanceIdentity:
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


def _parse_provenance(table: Mapping[str, Any], source: str) -> dict[str, Any]:
    updates: dict[str, Any] = {}
    if "policy" in table:
        policy = table["policy"]
        if policy not in PROVENANCE_POLICIES:
            known = ", ".join(PROVENANCE_POLICIES)
            raise ConfigError(
                source, "provenance.policy", f"expected one of {known}, got {policy!r}"
            )
        updates["provenance_policy"] = policy
    if "identities" in table:
        items = table["identities"]
        if not isinstance(items, list):
            raise ConfigError(source, "provenance.identities", "must be a list of tables")
        updates["provenance_identities"] = tuple(
            _parse_identity(v, source, f"provenance.identities[{i}]") for i, v in enumerate(items)
        )
    if "kernels_defaults" in table:
        updates["provenance_kernels_defaults"] = _bool(
            table["kernels_defaults"], source, "provenance.kernels_defaults"
        )
    if "trusted_root" in table:
        updates["provenance_trusted_root"] = _path(
            table["trusted_root"], source, "provenance.trusted_root"
        )
    return updates


def apply_env(cfg: Config, env: Mapping[str, str]) -> Config:
    """`KERNELD_STORE`, `KERNELD_SOCKET`, `KERNELD_ADMIN_SOCKET`, `KERNELD_LOG_LEVEL` override."""
    updates: dict[str, Any] = {}
    if env.get(locations.ENV_STORE):
        updates["store_path"] = Path(env[locations.ENV_STORE])
    if env.get(locations.ENV_SOCKET):
        updates["user_socket"] = replace(cfg.user_socket, path=Path(env[locations.ENV_SOCKET]))
    if env.get(locations.ENV_ADMIN_SOCKET):
        updates["admin_socket"] = replace(
            cfg.admin_socket, path=Path(env[locations.ENV_ADMIN_SOCKET])
        )
    if env.get("KERNELD_LOG_LEVEL"):
        updates["log_level"] = _env_level(env["KERNELD_LOG_LEVEL"])
    return replace(cfg, **updates)


def _env_level(value: str) -> str:
    if value not in ("debug", "info", "warning", "error"):
        raise ConfigError(
            "environment", "KERNELD_LOG_LEVEL", f"expected debug/info/warning/error, got {value!r}"
        )
    return value


def load_config(
    path: Path | None = None, *, env: Mapping[str, str] | None = None, system: bool | None = None
) -> Config:
    """Load the config: `path`, else $KERNELD_CONFIG, else the system or user file if present."""
    env = os.environ if env is None else env
    if path is None and env.get("KERNELD_CONFIG"):
        path = Path(env["KERNELD_CONFIG"])
    if system is None:
        system = os.geteuid() == 0 and path is None and locations.SYSTEM_CONFIG_FILE.exists()
    if path is None:
        candidate = locations.SYSTEM_CONFIG_FILE if system else locations.user_config_file()
        path = candidate if candidate.exists() else None
    if path is None:
        return apply_env(default_config(system=system), env)
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
    return apply_env(parse_config(doc, source=str(path), system=system), env)


def _toml_str(text: str) -> str:
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


def _toml(value: object) -> str:
    """A TOML literal for the few value types a Config holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return _toml_str(str(value))
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_str(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _prefetch_text(entry: PrefetchEntry) -> str:
    if entry.version is not None:
        return f"{entry.repo_id}:{entry.version}"
    if entry.revision is not None:
        return f"{entry.repo_id}@{entry.revision}"
    return entry.repo_id


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


#: Config field -> the kerneld.toml key that sets it: what log lines and `ReloadConfig` answers
#: name, since an admin knows `[resolve] ref_ttl`, not `ref_ttl_s`.
FIELD_KEYS: dict[str, str] = {
    "source": "(config file)",
    "system": "mode",
    "store_path": "[store] path",
    "cap_bytes": "[store] cap",
    "min_free_bytes": "[store] min_free",
    "gc_min_age_s": "[store] gc_min_age",
    "orphan_grace_s": "[store] orphan_grace",
    "scrub_interval_s": "[store] scrub_interval",
    "scrub_rate_bytes": "[store] scrub_rate",
    "quarantine_max_bytes": "[store] quarantine_max",
    "user_socket": "[sockets] user/user_mode/user_group",
    "admin_socket": "[sockets] admin/admin_mode/admin_group",
    "upstreams": "[[upstream]]",
    "ref_ttl_s": "[resolve] ref_ttl",
    "negative_ttl_s": "[resolve] negative_ttl",
    "lease_ttl_s": "[resolve] lease_ttl",
    "lease_max_s": "[resolve] lease_max",
    "lease_limit_per_client": "[resolve] lease_limit_per_client",
    "lease_limit": "[resolve] lease_limit",
    "fetch_allow": "[fetch] allow",
    "fetch_timeout_s": "[fetch] timeout",
    "fetch_attempts": "[fetch] attempts",
    "fetch_allow_groups": "[fetch] allow_groups",
    "fetch_per_uid_rate": "[fetch] per_uid_rate",
    "fetch_per_uid_burst": "[fetch] per_uid_burst",
    "prefetch": "[prefetch] kernels",
    "prefetch_torch": "[prefetch] torch",
    "prefetch_interval_s": "[prefetch] interval",
    "prefetch_on_start": "[prefetch] on_start",
    "trusted_keys": "[mirror] trusted_keys",
    "metrics_socket": "[metrics] socket",
    "metrics_listen": "[metrics] listen",
    "metrics_socket_mode": "[metrics] socket_mode",
    "metrics_socket_group": "[metrics] socket_group",
    "log_level": "[log] level",
    "drain_timeout_s": "[server] drain_timeout",
    "threads": "[server] threads",
    "max_connections": "[server] max_connections",
    "admin_max_connections": "[server] admin_max_connections",
    "idle_timeout_s": "[server] idle_timeout",
    "max_concurrent_rpcs": "[server] max_concurrent_rpcs",
    "max_resolve_many": "[server] max_resolve_many",
    "trust_publishers": "[trust] publishers",
    "trust_allow": "[trust] allow",
    "trust_ttl_s": "[trust] ttl",
    "trust_honor_remote_code": "[trust] honor_trust_remote_code",
    "hub_api_listen": "[hub_api] listen",
    "hub_api_socket": "[hub_api] socket",
    "provenance_policy": "[provenance] policy",
    "provenance_identities": "[provenance] identities",
    "provenance_kernels_defaults": "[provenance] kernels_defaults",
    "provenance_trusted_root": "[provenance] trusted_root",
}


def config_key(field_name: str) -> str:
    """The kerneld.toml key of a Config field (the field's name if it has none)."""
    return FIELD_KEYS.get(field_name, field_name)


def _plain_number(value: float) -> int | float:
    """60.0 as 60: a rate a person wrote as an integer reads back as one."""
    return int(value) if value.is_integer() else value


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML that `load_config` reads back to the same values
    (`kerneld --check-config`): what the daemon will actually use, defaults included."""
    tables: list[tuple[str, dict[str, object]]] = [
        (
            "store",
            {
                "path": cfg.store_path,
                "cap": format_size(cfg.cap_bytes or 0),
                "min_free": format_size(cfg.min_free_bytes),
                "gc_min_age": format_duration(cfg.gc_min_age_s),
                "orphan_grace": format_duration(cfg.orphan_grace_s),
                "scrub_interval": format_duration(cfg.scrub_interval_s),
                "scrub_rate": format_size(cfg.scrub_rate_bytes),
                "quarantine_max": format_size(cfg.quarantine_max_bytes),
            },
        ),
        (
            "sockets",
            {
                "user": cfg.user_socket.path,
                "user_mode": f"{cfg.user_socket.mode:04o}",
                "user_group": cfg.user_socket.group,
                "admin": cfg.admin_socket.path,
                "admin_mode": f"{cfg.admin_socket.mode:04o}",
                "admin_group": cfg.admin_socket.group,
            },
        ),
        (
            "resolve",
            {
                "ref_ttl": format_duration(cfg.ref_ttl_s),
                "negative_ttl": format_duration(cfg.negative_ttl_s),
                "lease_ttl": format_duration(cfg.lease_ttl_s),
                "lease_max": format_duration(cfg.lease_max_s),
                "lease_limit_per_client": cfg.lease_limit_per_client,
                "lease_limit": cfg.lease_limit,
            },
        ),
        (
            "fetch",
            {
                "allow": list(cfg.fetch_allow),
                "timeout": format_duration(cfg.fetch_timeout_s),
                "attempts": cfg.fetch_attempts,
                "allow_groups": list(cfg.fetch_allow_groups),
                "per_uid_rate": _plain_number(cfg.fetch_per_uid_rate),
                "per_uid_burst": cfg.fetch_per_uid_burst,
            },
        ),
        (
            "prefetch",
            {
                "kernels": [_prefetch_text(p) for p in cfg.prefetch],
                "torch": list(cfg.prefetch_torch),
                "interval": format_duration(cfg.prefetch_interval_s),
                "on_start": cfg.prefetch_on_start,
            },
        ),
        ("mirror", {"trusted_keys": dict(cfg.trusted_keys)}),
        (
            "metrics",
            {
                **{
                    k: v
                    for k, v in (("socket", cfg.metrics_socket), ("listen", cfg.metrics_listen))
                    if v
                },
                "socket_mode": f"{cfg.metrics_socket_mode:04o}",
                "socket_group": cfg.metrics_socket_group,
            },
        ),
        ("log", {"level": cfg.log_level}),
        (
            "server",
            {
                "drain_timeout": format_duration(cfg.drain_timeout_s),
                "threads": cfg.threads,
                "max_connections": cfg.max_connections,
                "admin_max_connections": cfg.admin_max_connections,
                "idle_timeout": format_duration(cfg.idle_timeout_s),
                "max_concurrent_rpcs": cfg.max_concurrent_rpcs,
                "max_resolve_many": cfg.max_resolve_many,
            },
        ),
        (
            "trust",
            {
                "publishers": cfg.trust_publishers,
                "allow": list(cfg.trust_allow),
                "ttl": format_duration(cfg.trust_ttl_s),
                "honor_trust_remote_code": cfg.trust_honor_remote_code,
            },
        ),
        (
            "hub_api",
            {
                "listen": cfg.hub_api_listen,
                **({"socket": cfg.hub_api_socket} if cfg.hub_api_socket else {}),
            },
        ),
        (
            "provenance",
            {
                "policy": cfg.provenance_policy,
                "identities": [i.as_toml() for i in cfg.provenance_identities],
                "kernels_defaults": cfg.provenance_kernels_defaults,
                **(
                    {"trusted_root": cfg.provenance_trusted_root}
                    if cfg.provenance_trusted_root
                    else {}
                ),
            },
        ),
    ]
    lines = [
        f"# kerneld configuration as resolved from {cfg.source}",
        f"mode = {_toml('system' if cfg.system else 'user')}",
    ]
    for name, values in tables:
        lines.append("")
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in values.items())
    for up in cfg.upstreams:
        loc_key = {"hub": "endpoint", "mirror-dir": "path", "mirror-http": "url"}[up.kind]
        lines += ["", "[[upstream]]", f"name = {_toml(up.name)}", f"kind = {_toml(up.kind)}"]
        if up.location:
            lines.append(f"{loc_key} = {_toml(up.location)}")
        if up.token_file is not None:
            lines.append(f"token_file = {_toml(up.token_file)}")
        if up.require_signatures:
            lines.append("require_signatures = true")
    return "\n".join(lines) + "\n"
