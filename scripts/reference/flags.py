"""The `kerneld` flags part of docs/configuration.md: `kerneld.server.main.build_parser()`'s
options and their help texts."""

from __future__ import annotations

from scripts.reference.markdown import cell


def render_flags() -> list[str]:
    from kerneld.server.main import build_parser

    out = ["| flag | meaning |", "| --- | --- |"]
    for action in build_parser()._actions:
        if not action.option_strings:
            continue
        flags = ", ".join(action.option_strings)
        if action.nargs != 0:
            flags += " " + (str(action.metavar) if action.metavar else action.dest.upper())
        out.append(f"| `{flags}` | {cell(action.help or '')} |")
    return out
