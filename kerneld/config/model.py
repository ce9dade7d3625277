"""The typed configuration the daemon reads (`cfg.ref_ttl_s`, `cfg.user_socket.mode`): frozen
dataclasses, and the defaults of system and user mode.

A field's default here is the key's default; `schema.py` says which kerneld.toml key sets which
field, and parsing, dumping and the generated reference all go through that table, so this
module lists each setting once, as the type the rest of the daemon uses.
"""

from __future__ import annotations

import contextlib
import grp
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kerneld_client import locations
from kerneld_client.published_index import repo_matches

UPSTREAM_KINDS = ("hub", "mirror-dir", "mirror-http")
#: The periodic scrub: weekly, at 32 MiB/s (a 20 GiB store takes about 11 minutes of reads).
DEFAULT_SCRUB_INTERVAL_S = 7 * 86400.0
DEFAULT_SCRUB_RATE = 32 << 20
#: The quarantine's bound, the store's own default (`kerneld.store.verify`, which says why; a
#: test keeps the two equal). Written here, not imported: importing `kerneld.store` for it made
#: every `kerneldctl` command that reads the environment import the whole store, 0.1 s of CPU.
DEFAULT_QUARANTINE_MAX_BYTES = 1 << 30
PROVENANCE_POLICIES = ("off", "warn", "require")
TRUST_MODES = ("hub", "allow-list", "any")
LOG_LEVELS = ("debug", "info", "warning", "error")


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
    """HOST:PORT of the metrics listener; a non-loopback one only with metrics_allow_remote."""
    metrics_allow_remote: bool = False
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

    @property
    def import_only(self) -> bool:
        """No upstream (`upstream = []`, or `--no-hub` alone): kernels arrive only by
        `kerneldctl mirror import`; the daemon never opens a network connection."""
        return not self.upstreams

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
    """The configuration with no file: system mode (the service) or user mode (one user)."""
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
