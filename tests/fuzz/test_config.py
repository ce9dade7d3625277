"""kerneld.toml and KERNELD_* variables: ConfigError, or a usable config that dump_config
writes back to the same values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import invariants as inv
from tests.fuzz.strategies import (
    FLOATS,
    HOSTILE_STRINGS,
    fuzz_settings,
    raw_mutations,
    toml_document,
    toml_text,
    toml_values,
)

toml_safe_hostile = st.sampled_from([s for s in HOSTILE_STRINGS if "\udc80" not in s])
paths = (
    st.sampled_from(["/var/lib/kerneld", "relative/store", "/srv/😀/store", "/a\x7fb"]) | toml_text
)
sizes = (
    st.sampled_from(["20GiB", "500MB", "1.5 kb", "0", "1024", " 7 TiB ", "9" * 400, "1e3"])
    | st.integers(-5, 2**70)
    | FLOATS
)
durations = (
    st.sampled_from(["90s", "5m", "1h30m", "250ms", "2d", "1 h", "9" * 400 + "s", "1.5.5s", ""])
    | st.integers(-5, 2**64)
    | FLOATS
)
modes = st.sampled_from(["0660", "660", "0o660", "07777", "0888", 0o600, 4096, -1])
prefetch = st.sampled_from(
    [
        "org/name",
        "org/name:1",
        "org/name@v1",
        "org/name@" + "c" * 40,
        "../..",
        "a/b:" + "1" * 5000,
        "a/b:\u0661",
        "a /b",
        "a/b@",
        ":1",
        "a/b:99999999999999999999999",
    ]
)
keys = st.sampled_from(["ed25519:" + "A" * 43 + "=", "ed25519:bad", "", "x"])


def valued(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes any TOML value or a hostile string."""
    return st.one_of(valid, valid, valid, toml_values, toml_safe_hostile)


upstream = st.fixed_dictionaries(
    {},
    optional={
        "kind": valued(st.sampled_from(["hub", "mirror-dir", "mirror-http"])),
        "name": valued(st.sampled_from(["hub", "site", "m1"])),
        "endpoint": valued(
            st.sampled_from(["https://huggingface.co", "http://127.0.0.1:1", "ftp://x"])
        ),
        "path": valued(paths),
        "url": valued(st.sampled_from(["https://mirror.example/kernels", "http://a b"])),
        "token_file": valued(paths),
    },
)
config_docs = st.fixed_dictionaries(
    {},
    optional={
        "mode": valued(st.sampled_from(["user", "system"])),
        "store": st.fixed_dictionaries(
            {},
            optional={
                "path": valued(paths),
                "cap": valued(sizes),
                "min_free": valued(sizes),
                "gc_min_age": valued(durations),
                "orphan_grace": valued(durations),
            },
        ),
        "sockets": st.fixed_dictionaries(
            {},
            optional={
                "user": valued(paths),
                "admin": valued(paths),
                "user_mode": valued(modes),
                "admin_mode": valued(modes),
                "user_group": valued(st.sampled_from(["kerneld-users", ""])),
            },
        ),
        "upstream": st.lists(upstream, max_size=3),
        "resolve": st.fixed_dictionaries(
            {},
            optional={
                k: valued(durations) for k in ("ref_ttl", "negative_ttl", "lease_ttl", "lease_max")
            },
        ),
        "fetch": st.fixed_dictionaries(
            {},
            optional={
                "allow": valued(st.lists(st.sampled_from(["*", "org/*", "a/b"]), max_size=3)),
                "timeout": valued(durations),
                "attempts": valued(st.integers(-1, 30)),
            },
        ),
        "prefetch": st.fixed_dictionaries(
            {},
            optional={
                "kernels": valued(st.lists(prefetch, max_size=3)),
                "torch": valued(
                    st.lists(st.sampled_from(["2.13", "2.12", "2", "².1"]), max_size=2)
                ),
                "interval": valued(durations),
                "on_start": valued(st.booleans()),
            },
        ),
        "mirror": st.fixed_dictionaries(
            {}, optional={"trusted_keys": valued(st.dictionaries(toml_text, keys, max_size=2))}
        ),
        "metrics": st.fixed_dictionaries(
            {},
            optional={
                "socket": valued(paths),
                "listen": valued(
                    st.sampled_from(
                        ["127.0.0.1:9464", "localhost:0", "[::1]:65536", "0.0.0.0:1", "127.0.0.1:²"]
                    )
                ),
            },
        ),
        "log": st.fixed_dictionaries(
            {}, optional={"level": valued(st.sampled_from(["debug", "info", "loud"]))}
        ),
        "server": st.fixed_dictionaries(
            {},
            optional={"drain_timeout": valued(durations), "threads": valued(st.integers(-1, 300))},
        ),
        "unknown": toml_values,
    },
)
envs = st.dictionaries(
    st.sampled_from(
        ["KERNELD_STORE", "KERNELD_SOCKET", "KERNELD_ADMIN_SOCKET", "KERNELD_LOG_LEVEL"]
    ),
    st.sampled_from(["debug", "warning", "/srv/kerneld/store", "loud"])
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20),
    max_size=3,
)
config_bytes = config_docs.map(lambda d: toml_document(d).encode())


@fuzz_settings(200)
@given(config_bytes | config_bytes.flatmap(raw_mutations) | st.binary(max_size=200), envs)
@example(b"a = " + b"[" * 3000 + b"]" * 3000, {})
@example(b"[store]\ncap = '" + b"9" * 400 + b"'\n", {})
@example(b"[metrics]\nlisten = '127.0.0.1:\xc2\xb2'\n", {})
@example(b"[prefetch]\nkernels = ['a/b:" + b"1" * 5000 + b"']\n", {})
@example(b"[prefetch]\nkernels = ['../..']\n", {})
@example(b"[resolve]\nlease_ttl = inf\nlease_max = inf\n", {})
@example(b"[store]\npath = '/srv/\xf0\x9f\x98\x80'\n", {})
@example(b'[store]\npath = "/a\\u0000b"\n', {})
def test_config(tmp_path: Path, data: bytes, env: dict[str, str]) -> None:
    inv.check_config(data, env, tmp_path)
