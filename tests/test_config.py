"""kerneld's configuration: defaults, a full file, every invalid value, env overrides, dumping."""

from __future__ import annotations

import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from kerneld.config import (
    KEYS,
    KNOWN_KEYS,
    Config,
    ConfigError,
    PrefetchEntry,
    ProvenanceIdentity,
    SocketConfig,
    UpstreamConfig,
    default_config,
    dump_config,
    load_config,
    parse_duration,
    parse_size,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "systemd" / "kerneld.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kerneld.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ---- defaults --------------------------------------------------------------------------------


def test_system_defaults() -> None:
    cfg = default_config(system=True)
    assert cfg.system
    assert cfg.store_path == Path("/var/lib/kerneld/store")
    assert cfg.user_socket == SocketConfig(
        Path("/run/kerneld/kerneld.sock"), 0o660, "kerneld-users"
    )
    assert cfg.admin_socket == SocketConfig(Path("/run/kerneld/admin.sock"), 0o660, "kerneld-admin")
    assert cfg.upstreams == (UpstreamConfig("hub", "hub"),)
    assert cfg.fetch_allowed("any/thing")
    assert (cfg.ref_ttl_s, cfg.lease_ttl_s, cfg.lease_max_s) == (300.0, 600.0, 86400.0)
    assert cfg.drain_timeout_s == 20.0 and cfg.threads == 16 and cfg.prefetch_on_start
    assert cfg.metrics_socket is None and cfg.metrics_listen == ""


def test_user_defaults_follow_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cfg = load_config(env={}, system=False)
    assert not cfg.system
    assert cfg.store_path == tmp_path / "cache" / "kerneld" / "store"
    assert cfg.user_socket == SocketConfig(tmp_path / "run" / "kerneld" / "kerneld.sock", 0o600)
    assert cfg.admin_socket.mode == 0o600
    assert cfg.source == "(defaults, user mode)"


def test_user_config_file_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "kerneld").mkdir()
    (tmp_path / "kerneld" / "kerneld.toml").write_text('[log]\nlevel = "debug"\n')
    cfg = load_config(env={}, system=False)
    assert cfg.log_level == "debug"
    assert cfg.source.endswith("kerneld.toml")


# ---- a full file -----------------------------------------------------------------------------

FULL = """
mode = "user"
[store]
path = "/srv/store"
cap = "20GiB"
min_free = "500MB"
gc_min_age = "2h"
orphan_grace = "10m"
[sockets]
user = "/srv/run/k.sock"
user_mode = "0666"
user_group = "users"
admin = "/srv/run/a.sock"
admin_mode = 0o640
admin_group = "wheel"
[[upstream]]
name = "site"
kind = "mirror-http"
url = "https://mirror.example/kernels"
require_signatures = true
[[upstream]]
kind = "mirror-dir"
path = "/mnt/mirror"
[[upstream]]
kind = "hub"
endpoint = "http://127.0.0.1:9999"
token_file = "/etc/kerneld/token"
[resolve]
ref_ttl = "1m30s"
negative_ttl = 5
lease_ttl = "10m"
lease_max = "1h"
[fetch]
allow = ["org/*", "other/one"]
timeout = "250ms"
attempts = 7
[prefetch]
kernels = ["org/a", "org/b:2", "org/c@main"]
torch = ["2.12", "2.13"]
interval = "30m"
on_start = false
[mirror]
trusted_keys = {site = "ed25519:AAAA"}
[metrics]
socket = "/srv/run/metrics.sock"
listen = "127.0.0.1:9464"
[log]
level = "warning"
[server]
drain_timeout = "3s"
threads = 32
[trust]
publishers = "allow-list"
allow = ["my-org/*", "kernels-community/activation"]
ttl = "10m"
honor_trust_remote_code = false
[provenance]
policy = "require"
identities = [
  { identity = "builds@example.org", issuer = "https://accounts.example.org" },
  { repository = "o/k", workflows = ["https://github.com/o/k/.github/workflows/b.yaml@main"] },
]
kernels_defaults = false
trusted_root = "/etc/kerneld/trusted_root.json"
"""


def test_full_file(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FULL), env={})
    assert not cfg.system
    assert cfg.store_path == Path("/srv/store")
    assert cfg.cap_bytes == 20 << 30
    assert cfg.min_free_bytes == 500_000_000
    assert cfg.gc_min_age_s == 7200 and cfg.orphan_grace_s == 600
    assert cfg.user_socket == SocketConfig(Path("/srv/run/k.sock"), 0o666, "users")
    assert cfg.admin_socket == SocketConfig(Path("/srv/run/a.sock"), 0o640, "wheel")
    assert cfg.upstreams == (
        UpstreamConfig(
            "site", "mirror-http", "https://mirror.example/kernels", require_signatures=True
        ),
        UpstreamConfig("mirror-dir-1", "mirror-dir", "/mnt/mirror"),
        UpstreamConfig("hub", "hub", "http://127.0.0.1:9999", Path("/etc/kerneld/token")),
    )
    assert (cfg.ref_ttl_s, cfg.negative_ttl_s, cfg.lease_ttl_s, cfg.lease_max_s) == (
        90,
        5,
        600,
        3600,
    )
    assert cfg.fetch_allowed("org/x") and cfg.fetch_allowed("other/one")
    assert cfg.fetch_allowed("Org/X") and cfg.fetch_allowed("OTHER/One")  # the Hub's ids
    assert not cfg.fetch_allowed("other/two")
    assert (cfg.fetch_timeout_s, cfg.fetch_attempts) == (0.25, 7)
    assert cfg.prefetch == (
        PrefetchEntry("org/a"),
        PrefetchEntry("org/b", version=2),
        PrefetchEntry("org/c", revision="main"),
    )
    assert cfg.prefetch_torch == ("2.12", "2.13")
    assert cfg.prefetch_interval_s == 1800 and not cfg.prefetch_on_start
    assert dict(cfg.trusted_keys) == {"site": "ed25519:AAAA"}
    assert cfg.metrics_socket == Path("/srv/run/metrics.sock")
    assert cfg.metrics_listen == "127.0.0.1:9464"
    assert cfg.log_level == "warning"
    assert (cfg.drain_timeout_s, cfg.threads) == (3, 32)
    assert cfg.trust_publishers == "allow-list" and cfg.trust_ttl_s == 600
    assert cfg.publisher_allowed("my-org/x") and cfg.publisher_allowed(
        "kernels-community/activation"
    )
    assert not cfg.publisher_allowed("kernels-community/relu")
    assert cfg.publisher_allowed("My-Org/x") and cfg.publisher_allowed(
        "Kernels-Community/Activation"
    )
    assert not cfg.trust_honor_remote_code
    assert cfg.provenance_policy == "require" and not cfg.provenance_kernels_defaults
    assert cfg.provenance_identities == (
        ProvenanceIdentity(identity="builds@example.org", issuer="https://accounts.example.org"),
        ProvenanceIdentity(
            repository="o/k",
            workflows=("https://github.com/o/k/.github/workflows/b.yaml@main",),
        ),
    )
    assert cfg.provenance_trusted_root == Path("/etc/kerneld/trusted_root.json")


@pytest.mark.parametrize("text", ["", FULL])
def test_dump_round_trips(tmp_path: Path, text: str) -> None:
    cfg = load_config(write(tmp_path, text), env={}, system=True)
    dumped = dump_config(cfg)
    path = tmp_path / "dumped.toml"
    path.write_text(dumped, encoding="utf-8")
    again = load_config(path, env={})
    assert isinstance(again, Config)
    assert {**again.__dict__, "source": ""} == {**cfg.__dict__, "source": ""}


def test_the_key_table_sets_every_config_field_once() -> None:
    """A Config field no key sets could not be configured, dumped or documented; two keys for
    one value would make the dump ambiguous."""
    set_by = [k.field for k in KEYS]
    assert len(set_by) == len(set(set_by)), "two keys set the same value"
    assert {f.partition(".")[0] for f in set_by} == {f.name for f in fields(Config)} - {"source"}
    for nested in ("user_socket", "admin_socket"):
        parts = {f.partition(".")[2] for f in set_by if f.startswith(nested + ".")}
        assert parts == {f.name for f in fields(SocketConfig)}, nested


# ---- every invalid value names the file and the key -----------------------------------------

INVALID = [
    ("mode = 'cluster'", "mode"),
    ("bogus = 1", "bogus"),
    ("store = 3", "store"),
    ("[store]\npath = ''", "store.path"),
    ("[store]\npath = 3", "store.path"),
    ("[store]\ncap = 'lots'", "store.cap"),
    ("[store]\ncap = -1", "store.cap"),
    ("[store]\nmin_free = '1 parsec'", "store.min_free"),
    ("[store]\ngc_min_age = 'soon'", "store.gc_min_age"),
    ("[store]\norphan_grace = 'later'", "store.orphan_grace"),
    ("[store]\nsize = 1", "store.size"),
    ("[sockets]\nuser = ''", "sockets.user"),
    ("[sockets]\nadmin = 5", "sockets.admin"),
    ("[sockets]\nuser_mode = '0999'", "sockets.user_mode"),
    ("[sockets]\nadmin_mode = 99999", "sockets.admin_mode"),
    ("[sockets]\nuser_group = 7", "sockets.user_group"),
    ("[sockets]\nadmin_group = true", "sockets.admin_group"),
    ("[sockets]\nport = 1", "sockets.port"),
    ("upstream = 'hub'", "upstream"),
    ("[[upstream]]\nkind = 'ftp'", "upstream[0].kind"),
    ("[[upstream]]\nkind = 'mirror-dir'", "upstream[0].path"),
    ("[[upstream]]\nkind = 'mirror-http'\nurl = 'ftp://x'", "upstream[0].url"),
    ("[[upstream]]\nkind = 'hub'\nendpoint = 'huggingface.co'", "upstream[0].endpoint"),
    ("[[upstream]]\nkind = 'hub'\nendpoint = 5", "upstream[0].endpoint"),
    ("[[upstream]]\nkind = 'hub'\nname = 5", "upstream[0].name"),
    ("[[upstream]]\nkind = 'hub'\ntoken_file = 5", "upstream[0].token_file"),
    ("[[upstream]]\nkind = 'hub'\nprio = 5", "upstream[0].prio"),
    ("[[upstream]]\nkind = 'hub'\nrequire_signatures = true", "upstream[0].require_signatures"),
    (
        "[[upstream]]\nkind = 'mirror-dir'\npath = '/m'\nrequire_signatures = 'yes'",
        "upstream[0].require_signatures",
    ),
    ("[[upstream]]\nkind = 'hub'\n[[upstream]]\nkind = 'hub'", "upstream"),
    ("[resolve]\nref_ttl = 'soon'", "resolve.ref_ttl"),
    ("[resolve]\nnegative_ttl = -1", "resolve.negative_ttl"),
    ("[resolve]\nlease_ttl = '1x'", "resolve.lease_ttl"),
    ("[resolve]\nlease_max = true", "resolve.lease_max"),
    ("[resolve]\nlease_ttl = '2h'\nlease_max = '1h'", "resolve.lease_ttl"),
    ("[resolve]\nlease_ttl = 0", "resolve.lease_ttl"),
    ("[fetch]\nallow = 'org/*'", "fetch.allow"),
    ("[fetch]\nallow = [1]", "fetch.allow"),
    ("[fetch]\ntimeout = 'fast'", "fetch.timeout"),
    ("[fetch]\nattempts = 0", "fetch.attempts"),
    ("[fetch]\nattempts = 'many'", "fetch.attempts"),
    ("[prefetch]\nkernels = 'org/a'", "prefetch.kernels"),
    ("[prefetch]\nkernels = ['not a repo']", "prefetch.kernels[0]"),
    ("[prefetch]\nkernels = ['org/a', 'org/b:x']", "prefetch.kernels[1]"),
    ("[prefetch]\ntorch = ['2']", "prefetch.torch"),
    ("[prefetch]\ntorch = '2.13'", "prefetch.torch"),
    ("[prefetch]\ninterval = 'hourly'", "prefetch.interval"),
    ("[prefetch]\ninterval = '100ms'", "prefetch.interval"),
    ("[prefetch]\non_start = 'yes'", "prefetch.on_start"),
    ("[mirror]\ntrusted_keys = ['k']", "mirror.trusted_keys"),
    ("[mirror]\ntrusted_keys = {k = 1}", "mirror.trusted_keys"),
    ("[metrics]\nsocket = ''", "metrics.socket"),
    ("[metrics]\nlisten = '0.0.0.0:9464'", "metrics.listen"),
    ("[metrics]\nlisten = '127.0.0.1'", "metrics.listen"),
    ("[metrics]\nlisten = '127.0.0.1:99999'", "metrics.listen"),
    ("[log]\nlevel = 'loud'", "log.level"),
    ("[server]\ndrain_timeout = 'never'", "server.drain_timeout"),
    ("[server]\nthreads = 0", "server.threads"),
    ("[server]\nthreads = 1000", "server.threads"),
    ("[server]\nworkers = 2", "server.workers"),
    ("[trust]\npublishers = 'trusted'", "trust.publishers"),
    ("[trust]\nallow = 'org/*'", "trust.allow"),
    ("[trust]\nallow = ['my-org']", "trust.allow"),
    ("[trust]\nttl = 'daily'", "trust.ttl"),
    ("[trust]\nhonor_trust_remote_code = 'yes'", "trust.honor_trust_remote_code"),
    ("[provenance]\npolicy = 'strict'", "provenance.policy"),
    ("[provenance]\nidentities = {identity = 'a'}", "provenance.identities"),
    ("[provenance]\nidentities = ['me@example.org']", "provenance.identities[0]"),
    ("[provenance]\nidentities = [{identity = 'me@example.org'}]", "provenance.identities[0]"),
    (
        "[provenance]\nidentities = [{repository = 'org', workflows = ['https://x']}]",
        "provenance.identities[0]",
    ),
    (
        "[provenance]\nidentities = [{repository = 'o/r', workflows = []}]",
        "provenance.identities[0]",
    ),
    ("[provenance]\nkernels_defaults = 1", "provenance.kernels_defaults"),
    ("[provenance]\ntrusted_root = ''", "provenance.trusted_root"),
    ("[provenance]\nsigstore = true", "provenance.sigstore"),
]


@pytest.mark.parametrize(("text", "key"), INVALID)
def test_invalid_value_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.source == str(path)
    assert info.value.key == key
    assert info.value.reason
    assert str(info.value).startswith(f"{path}: {key}: ")


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    bad = write(tmp_path, "[store\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(bad, env={})
    assert info.value.key == "(file)"
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.toml", env={})


def test_unit_parsers() -> None:
    assert parse_size("1.5KiB", source="s", key="k") == 1536
    assert parse_size(7, source="s", key="k") == 7
    assert parse_duration("1h30m", source="s", key="k") == 5400
    assert parse_duration("250ms", source="s", key="k") == 0.25
    with pytest.raises(ConfigError):
        parse_duration("5m1", source="s", key="k")


# ---- environment -----------------------------------------------------------------------------


def test_env_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    cfg = load_config(
        path,
        env={
            "KERNELD_STORE": "/env/store",
            "KERNELD_SOCKET": "/env/k.sock",
            "KERNELD_ADMIN_SOCKET": "/env/a.sock",
            "KERNELD_LOG_LEVEL": "debug",
        },
    )
    assert cfg.store_path == Path("/env/store")
    assert cfg.user_socket == SocketConfig(Path("/env/k.sock"), 0o666, "users")  # mode kept
    assert cfg.admin_socket.path == Path("/env/a.sock")
    assert cfg.log_level == "debug"


def test_env_names_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[log]\nlevel = 'error'\n")
    assert load_config(env={"KERNELD_CONFIG": str(path)}).log_level == "error"


def test_invalid_env_value() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"KERNELD_LOG_LEVEL": "chatty"}, system=False)
    assert (info.value.source, info.value.key) == ("environment", "KERNELD_LOG_LEVEL")


# ---- the shipped example ---------------------------------------------------------------------


def _uncommented(text: str) -> str:
    """The example with every optional `# key = value` / `# [[table]]` line switched on (but
    `upstream = []`, the import-only alternative to the `[[upstream]]` tables)."""
    pattern = re.compile(r"^# ?((?:\[\[?[a-z]+\]\]?)|(?:[a-z_]+ = .*))$")
    return "\n".join(
        m.group(1) if (m := pattern.match(line)) and m.group(1) != IMPORT_ONLY else line
        for line in text.splitlines()
    )


IMPORT_ONLY = "upstream = []"


def test_example_config_loads_and_documents_every_key(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    cfg = load_config(EXAMPLE, env={})
    assert cfg.system and cfg.store_path == Path("/var/lib/kerneld/store")
    # The active values are the defaults of system mode, except the spelled-out hub endpoint.
    expected = default_config(system=True)
    assert {**cfg.__dict__, "source": "", "upstreams": ()} == {
        **expected.__dict__,
        "source": "",
        "upstreams": (),
    }
    # The optional lines are valid too, and with them every known key appears exactly once.
    full = load_config(write(tmp_path, _uncommented(text)), env={})
    assert [u.kind for u in full.upstreams] == ["hub", "mirror-http", "mirror-dir"]
    assert full.metrics_socket is not None and full.metrics_listen
    doc = tomllib.loads(_uncommented(text))
    for section, keys in KNOWN_KEYS.items():
        if section == "upstream":
            present = set().union(*(set(u) for u in doc["upstream"]))
        else:
            present = set(doc.get(section, {})) if section else set(doc)
        assert keys <= present, f"[{section}] undocumented keys: {sorted(keys - present)}"
    # The import-only line, switched on with the Hub's table deleted (docs/operations.md).
    tables = re.sub(r"(?ms)^\[\[upstream\]\]$.*?^$", "", text)
    airgap = load_config(write(tmp_path, tables.replace(f"# {IMPORT_ONLY}", IMPORT_ONLY)), env={})
    assert airgap.import_only and f"# {IMPORT_ONLY}\n" in text


def test_required_signatures_need_trusted_keys(tmp_path: Path) -> None:
    from kerneld.pipeline.upstreams import build_upstreams

    text = "[[upstream]]\nkind = 'mirror-dir'\npath = '/m'\nrequire_signatures = true\n"
    cfg = load_config(write(tmp_path, text), env={})
    with pytest.raises(ConfigError, match="no \\[mirror\\] trusted_keys") as info:
        build_upstreams(cfg)
    assert info.value.key == "upstream[0].require_signatures"


def test_the_hub_api_is_off_by_default_and_only_ever_on_loopback(tmp_path: Path) -> None:
    from kerneld.server.main import apply_flags, build_parser

    for system in (True, False):
        off = default_config(system=system)
        assert (off.hub_api_listen, off.hub_api_socket) == ("", None)
    path = write(tmp_path, '[hub_api]\nlisten = "127.0.0.1:8484"\nsocket = "/srv/run/hub.sock"\n')
    cfg = load_config(path, env={})
    assert (cfg.hub_api_listen, cfg.hub_api_socket) == ("127.0.0.1:8484", Path("/srv/run/hub.sock"))
    assert load_config(write(tmp_path, dump_config(cfg)), env={}).hub_api_listen == "127.0.0.1:8484"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, '[hub_api]\nlisten = "0.0.0.0:8484"\n'), env={})
    assert info.value.key == "hub_api.listen"

    flagged = apply_flags(cfg, build_parser().parse_args(["--hub-api-listen", "[::1]:9000"]))
    assert flagged.hub_api_listen == "[::1]:9000"
    with pytest.raises(ConfigError, match="--hub-api-listen"):
        apply_flags(cfg, build_parser().parse_args(["--hub-api-listen", "10.0.0.1:80"]))


def test_an_import_only_host_is_one_setting_and_deleting_the_hub_entry_brings_the_default(
    tmp_path: Path,
) -> None:
    """`upstream = []` (or `--no-hub` alone) is an import-only host, not an error; a file with
    no `upstream` key at all keeps the default (the Hub), as docs/operations.md says."""
    from kerneld.server.main import apply_flags, build_parser

    cfg = load_config(write(tmp_path, 'upstream = []\n[log]\nlevel = "info"\n'), env={})
    assert cfg.upstreams == () and cfg.import_only
    assert load_config(write(tmp_path, dump_config(cfg)), env={}).import_only  # round trip
    without = load_config(write(tmp_path, '[log]\nlevel = "info"\n'), env={})
    assert [u.kind for u in without.upstreams] == ["hub"] and not without.import_only
    no_hub = apply_flags(without, build_parser().parse_args(["--no-hub"]))
    assert no_hub.upstreams == () and no_hub.import_only
    mirrored = apply_flags(
        without, build_parser().parse_args(["--no-hub", "--upstream-mirror-dir", "/m"])
    )
    assert [u.kind for u in mirrored.upstreams] == ["mirror-dir"] and not mirrored.import_only
    with pytest.raises(ConfigError, match="upstream = \\[\\]") as info:
        load_config(write(tmp_path, 'upstream = "none"\n'), env={})
    assert info.value.key == "upstream"
