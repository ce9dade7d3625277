"""The kerneld.toml part of docs/configuration.md: one table per section, each key with its
default (system mode, and user mode where it differs), the environment variables and `kerneld`
flags that override it, and its meaning.

The keys are those of the key table (`kerneld.config.KNOWN_KEYS`); the defaults come from
`dump_config(default_config(...))` (user-mode paths shown with `~` and `$XDG_RUNTIME_DIR`); the
meanings are the comment paragraphs above the keys in systemd/kerneld.toml; the overrides are
found by trying each variable and flag on the real config loader and seeing which key changes.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from scripts.reference import ROOT
from scripts.reference.markdown import UNDOCUMENTED, cell

EXAMPLE = ROOT / "systemd" / "kerneld.toml"


@dataclass
class Group:
    """Keys of one section that one comment paragraph of systemd/kerneld.toml describes."""

    section: str
    text: str
    keys: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # key -> value written in the example


_HEADER = re.compile(r"^(?:#\s?)?\[\[?([a-z_]+)\]\]?\s*$")
_KEY = re.compile(r"^(#\s?)?([a-z_]+)\s*=\s*(.*)$")


def parse_example(text: str) -> list[Group]:
    """The example file as groups: a comment paragraph followed by the keys it describes
    (optional keys are commented out as `# key = value`; repeats of a key are skipped)."""
    groups: list[Group] = []
    section = ""
    pending: list[str] = []
    seen: set[tuple[str, str]] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            pending = []  # a paragraph describes only what touches it
            continue
        if m := _HEADER.match(line):
            section = m.group(1)
            continue
        if m := _KEY.match(line):
            key, literal = m.group(2), m.group(3)
            if (section, key) in seen:
                continue
            seen.add((section, key))
            value = tomllib.loads(f"v = {literal}")["v"]
            if pending or not groups or groups[-1].section != section:
                groups.append(Group(section, " ".join(pending)))
                pending = []
            groups[-1].keys.append(key)
            groups[-1].values[key] = value
            continue
        if line.startswith("#"):
            pending.append(line.lstrip("#").strip())
    return groups


@contextlib.contextmanager
def placeholder_home() -> Iterator[None]:
    """User-mode defaults depend on $HOME and XDG variables: show them as `~` and names."""
    saved = dict(os.environ)
    try:
        for name in list(os.environ):
            if name.startswith(("XDG_", "KERNELD_")):
                del os.environ[name]
        os.environ["HOME"] = "~"
        os.environ["XDG_RUNTIME_DIR"] = "$XDG_RUNTIME_DIR"
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


Flat = dict[tuple[str, str], Any]


def flatten(dumped: str) -> Flat:
    """A dump_config document as {(section, key): value}; [[upstream]] as one value."""
    doc = tomllib.loads(dumped)
    out: Flat = {}
    for name, value in doc.items():
        if name == "upstream":
            out[("upstream", "")] = value
        elif isinstance(value, dict):
            out.update({(name, k): v for k, v in value.items()})
        else:
            out[("", name)] = value
    return out


def defaults(*, system: bool) -> Flat:
    from kerneld.config import default_config, dump_config

    with placeholder_home():
        return flatten(dump_config(default_config(system=system)))


def _upstream_default(key: str, flat: Flat) -> Any:
    ups = flat[("upstream", "")]
    return ups[0].get(key) if ups and key in ups[0] else None


def _resolved(argv: list[str], env: Mapping[str, str]) -> Flat | None:
    """The config `kerneld ARGV` would run with under `env` (no config file); None if invalid."""
    from kerneld.config import ConfigError, dump_config
    from kerneld.server.main import build_parser, resolve_config

    with tempfile.TemporaryDirectory() as tmp, placeholder_home():
        empty = Path(tmp) / "empty.toml"
        empty.write_text("", encoding="utf-8")
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = build_parser().parse_args(["--config", str(empty), *argv])
            return flatten(dump_config(resolve_config(args, env=env)))
        except (ConfigError, SystemExit):
            return None


_SAMPLES = ("/kerneld-probe", "7", "error", "127.0.0.1:9464", "http://probe.invalid")


def _changed(base: Flat, probed: Flat | None) -> set[tuple[str, str]]:
    if probed is None:
        return set()
    return {k for k in base.keys() | probed.keys() if base.get(k) != probed.get(k)}


def overrides(env_names: list[str]) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> the environment variables and flags that change it, found by trying."""
    from kerneld.server.main import build_parser

    base = _resolved([], {})
    assert base is not None
    found: dict[tuple[str, str], list[str]] = {}
    for name in env_names:
        for sample in _SAMPLES:
            if changed := _changed(base, _resolved([], {name: sample})):
                for key in sorted(changed):
                    found.setdefault(key, []).append(f"`{name}`")
                break
    for action in build_parser()._actions:
        flag = max(action.option_strings, key=len, default="")
        if not flag or flag in ("--help", "--version", "--config"):
            continue
        if action.nargs == 0:
            trials = [[flag]]
        else:
            choices = list(action.choices or [])
            trials = [[flag, str(c)] for c in (choices or _SAMPLES)]
        for argv in trials:
            if changed := _changed(base, _resolved(argv, {})):
                if ("", "mode") in changed:  # a mode switch moves every mode default
                    changed = {("", "mode")}
                for key in sorted(changed):
                    found.setdefault(key, []).append(f"`{flag}`")
                break
    return found


def _toml(value: Any) -> str:
    from kerneld.config import toml_literal

    return toml_literal(value)


def _display(section: str, key: str, group: Group, flat: Flat) -> str:
    """The default as the example spells it when that means the same value, else as code has it."""
    from kerneld.config import parse_config

    if section == "upstream":
        value = _upstream_default(key, flat)
        return f"`{_toml(value)}`" if value is not None else "unset"
    if (section, key) not in flat:
        return "unset"
    code = flat[(section, key)]
    written = group.values.get(key)
    if written is not None:
        doc: dict[str, Any] = {key: written} if not section else {section: {key: written}}
        with contextlib.suppress(ValueError), placeholder_home():
            from kerneld.config import dump_config

            parsed = flatten(dump_config(parse_config(doc, source="", system=True)))
            if parsed.get((section, key)) == code:
                return f"`{_toml(written)}`"
    return f"`{_toml(code)}`"


def render_keys(found: dict[tuple[str, str], list[str]]) -> list[str]:
    from kerneld.config import KNOWN_KEYS

    groups = parse_example(EXAMPLE.read_text(encoding="utf-8"))
    system, user = defaults(system=True), defaults(system=False)
    documented = {(g.section, k) for g in groups for k in g.keys}
    missing = [
        (section, key)
        for section, keys in KNOWN_KEYS.items()
        for key in sorted(keys)
        # top-level names that are tables are sections, not keys
        if (section, key) not in documented and not (section == "" and key in KNOWN_KEYS)
    ]
    for section, key in missing:
        groups.append(Group(section, UNDOCUMENTED + " (add it to systemd/kerneld.toml)", [key]))
    out: list[str] = []
    sections = list(dict.fromkeys(g.section for g in groups))
    for section in sections:
        title = f"`[[{section}]]`" if section == "upstream" else f"`[{section}]`"
        out += ["", f"### {title if section else 'Top level'}", ""]
        if section == "upstream":
            out += [
                "An array of tables; the upstreams are asked in this order. Default (a file "
                'with no `upstream` key): one `{name = "hub", kind = "hub"}`. `upstream = []` '
                "(at the top level, before any `[section]`): no upstream, an import-only host "
                "that never opens a network connection and gets its kernels by `kerneldctl "
                "mirror import` (`kerneld --no-hub` alone does the same). Changed by: "
                + (", ".join(found.get(("upstream", ""), [])) or "nothing else")
                + ".",
                "",
            ]
        out += [
            "| key | default | also set by | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for group in (g for g in groups if g.section == section):
            first = group.keys[0]
            for key in group.keys:
                default = _display(section, key, group, system)
                if section != "upstream" and user.get((section, key)) != system.get((section, key)):
                    user_value = f"`{_toml(user[(section, key)])}`"
                    default = f"system: {default}<br>user: {user_value}"
                meaning = cell(group.text) if key == first else f"see `{first}`"
                by = ", ".join(found.get((section, key), [])) or ""
                out.append(f"| `{key}` | {default} | {by} | {meaning} |")
    return out
