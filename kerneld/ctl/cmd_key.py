"""`kerneldctl key generate|public`: the Ed25519 keys that sign mirrors.

The hint printed after `generate` must work on the shipped kerneld.toml, whose `[mirror]` section
holds `trusted_keys = {}`: an inline table, which TOML forbids extending from anywhere else (a
`[mirror.trusted_keys]` table or a dotted key would be a second declaration). So the hint is a
replacement of that line, and the JSON document carries the exact setting.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from kerneld.ctl.common import EXIT_OK, CtlError, Ctx, PermissionDenied
from kerneld.ctl.subcommands import FORMATTER, Commands, epilog

#: What TOML accepts as a bare key; other key names (with '.') must be quoted.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key_dir(ctx: Ctx) -> Path | None:
    value = getattr(ctx.args, "key_dir", None)
    return Path(value) if value else None


def toml_key(name: str) -> str:
    """`name` as a TOML key: bare where TOML allows it, else quoted (a '.' would nest)."""
    return name if _BARE_KEY.match(name) else f'"{name}"'


def trusted_keys_setting(name: str, public: str) -> str:
    """The `[mirror]` line that trusts one key, as it replaces the shipped `trusted_keys = {}`."""
    return f'trusted_keys = {{ {toml_key(name)} = "{public}" }}'


def _denied(what: str, path: Path, name: str, exc: OSError) -> PermissionDenied:
    return PermissionDenied(
        f"cannot {what} key {name!r} in {path}: {exc.strerror or exc}",
        hint="keys belong to the user that signs exports (on a system install the daemon's: "
        f"`runuser -u kerneld -- kerneldctl key {'public' if what == 'read' else 'generate'} "
        f"{name}` as root), or give a directory you own with --key-dir",
    )


def cmd_key_generate(ctx: Ctx) -> int:
    from kerneld.mirror.keys import KeyFileError, default_key_dir, generate_key

    key_dir = _key_dir(ctx) or default_key_dir()
    try:
        key = generate_key(ctx.args.name, key_dir, overwrite=bool(ctx.args.force))
    except KeyFileError as exc:
        raise CtlError(str(exc)) from None
    except PermissionError as exc:
        raise _denied("create", key_dir, ctx.args.name, exc) from None
    setting = trusted_keys_setting(key.name, key.public)
    entry = f'{toml_key(key.name)} = "{key.public}"'
    doc: dict[str, Any] = {
        "name": key.name,
        "public_key": key.public,
        "private_key_file": str(key_dir / f"{key.name}.key"),
        "public_key_file": str(key_dir / f"{key.name}.pub"),
        "trusted_keys_line": entry,
        "trusted_keys_setting": setting,
    }
    if ctx.json:
        ctx.emit_json(doc)
        return EXIT_OK
    ctx.say(f"created {doc['private_key_file']} (keep it secret) and {doc['public_key_file']}")
    ctx.say("on each importing host, in kerneld.toml's [mirror] section, replace the line")
    ctx.say("  trusted_keys = {}")
    ctx.say("with")
    ctx.say(f"  {setting}")
    ctx.say(
        "(where trusted_keys already lists keys, add this inside its braces, after a comma: "
        f"{entry}), then reload the daemon: systemctl reload kerneld"
    )
    return EXIT_OK


def cmd_key_public(ctx: Ctx) -> int:
    from kerneld.mirror.keys import KeyFileError, default_key_dir, load_public_key

    key_dir = _key_dir(ctx) or default_key_dir()
    try:
        public = load_public_key(ctx.args.name, key_dir)
    except KeyFileError as exc:
        raise CtlError(str(exc)) from None
    except PermissionError as exc:
        raise _denied("read", key_dir, ctx.args.name, exc) from None
    if ctx.json:
        ctx.emit_json(
            {
                "name": ctx.args.name,
                "public_key": public,
                "trusted_keys_setting": trusted_keys_setting(ctx.args.name, public),
            }
        )
    else:
        ctx.out.write(public + "\n")
    return EXIT_OK


def register(commands: Commands) -> None:
    key = commands.group(
        "key",
        "Manage mirror signing keys.",
        "Manage Ed25519 mirror signing keys. Keys live in --key-dir, default "
        "$KERNELD_KEY_DIR, else /etc/kerneld/keys (root), else ~/.config/kerneld/keys.",
        "  kerneldctl key generate site-1\n  kerneldctl key public site-1\n",
        dest="key_command",
        metavar="generate|public",
    )
    key_common = argparse.ArgumentParser(add_help=False)
    key_common.add_argument("--json", action="store_true", help="print one JSON document")
    key_common.add_argument("--key-dir", metavar="DIR", help="key directory")
    p = key.add_parser(
        "generate",
        parents=[key_common],
        help="Create NAME.key (0600) and NAME.pub.",
        epilog=epilog("  kerneldctl key generate site-2\n"),
        formatter_class=FORMATTER,
    )
    p.set_defaults(handler=cmd_key_generate)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--force", action="store_true", help="replace an existing key")
    p = key.add_parser(
        "public",
        parents=[key_common],
        help="Print NAME's public key (for [mirror] trusted_keys on importing hosts).",
        epilog=epilog("  kerneldctl key public site-1\n"),
        formatter_class=FORMATTER,
    )
    p.set_defaults(handler=cmd_key_public)
    p.add_argument("name", metavar="NAME")
