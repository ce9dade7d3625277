#!/usr/bin/env python3
"""Generate the reference parts of the docs from the code: docs/configuration.md (every
kerneld.toml key, environment variable and `kerneld` flag) and the metrics table of
docs/operations.md.

    .venv/bin/python scripts/gen_reference.py            # rewrite the generated blocks
    .venv/bin/python scripts/gen_reference.py --check    # exit 1 if one is out of date
    .venv/bin/python scripts/gen_reference.py --stdout   # print them

Nothing here is a hand-kept list, so the reference cannot drift from the code. Each part has
its generator in scripts/reference/, whose docstring says where it finds what it writes:

- **kerneld.toml keys** (`config_keys`): the keys of `kerneld.config`'s key table, their
  defaults, the comments above them in `systemd/kerneld.toml` (the example file a test already
  checks covers every key), and the `KERNELD_*` variables and `kerneld` flags that override them.
- **Environment variables** (`environment`): every variable `kerneld/` and
  `client/kerneld_client/` read, described from the code around the read.
- **`kerneld` flags** (`flags`): `kerneld.server.main.build_parser()`'s options and help texts.
- **Metrics** (`metrics`): what a `kerneld.server.plumbing.metrics.Metrics` registry exports.

Exit status: 0 written (or up to date with --check); 1 out of date (--check), or something has no
description (the block is still written, with the gap marked).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "client")]

# After the path: the generators (and the kerneld code they read) come from this checkout.
from scripts.reference.config_keys import overrides, render_keys  # noqa: E402
from scripts.reference.environment import environment, render_env  # noqa: E402
from scripts.reference.flags import render_flags  # noqa: E402
from scripts.reference.markdown import BEGIN, END, UNDOCUMENTED  # noqa: E402
from scripts.reference.metrics import generate_metrics  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
OPERATIONS = ROOT / "docs" / "operations.md"


def generate() -> tuple[str, list[str]]:
    """The generated block (markers included) and what lacks a description."""
    variables = environment()
    found = overrides([v.name for v in variables if v.name.startswith("KERNELD_")])
    for (section, key), names in sorted(found.items()):
        for var in variables:
            if f"`{var.name}`" in names and key:
                var.overrides.append(f"[{section}] {key}" if section else key)
    lines = [
        BEGIN,
        "",
        "## kerneld.toml",
        "",
        "Defaults are those of system mode unless a user-mode value is shown; sizes and",
        "durations are written as in the example file. *Also set by* lists the environment",
        "variables and `kerneld` flags that override the key (they win over the file).",
        *render_keys(found),
        "",
        "## Environment variables",
        "",
        "Every variable the daemon, `kerneldctl` and the client library read (*read in* names",
        "the modules that read it). User-mode paths also follow `HOME`, `XDG_RUNTIME_DIR`,",
        "`XDG_CACHE_HOME` and `XDG_CONFIG_HOME`.",
        "",
        *render_env(variables),
        "",
        "## `kerneld` command-line flags",
        "",
        *render_flags(),
        "",
        END,
    ]
    text = "\n".join(lines) + "\n"
    gaps = [line for line in lines if UNDOCUMENTED in line]
    return text, gaps


def splice(document: str, block: str, path: Path = DOC) -> str:
    """`document` with its generated block replaced by `block`."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: the markers {BEGIN!r} and {END!r} are missing")
    return document[:start] + block + document[end + len(END) + 1 :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is out of date")
    parser.add_argument("--stdout", action="store_true", help="print the block, write nothing")
    parser.add_argument("--doc", type=Path, default=DOC, help="configuration document")
    parser.add_argument("--ops-doc", type=Path, default=OPERATIONS, help="operations document")
    args = parser.parse_args(argv)
    block, gaps = generate()
    outputs = {args.doc: block, args.ops_doc: generate_metrics()}
    stale = False
    for path, text in outputs.items():
        if args.stdout:
            print(text, end="")
            continue
        current = path.read_text(encoding="utf-8")
        wanted = splice(current, text, path)
        if args.check:
            if current != wanted:
                diff = difflib.unified_diff(
                    current.splitlines(), wanted.splitlines(), "committed", "generated", lineterm=""
                )
                print("\n".join(diff))
                print(f"{path} is out of date: run scripts/gen_reference.py")
                stale = True
        elif current != wanted:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {path}")
    for gap in gaps:
        print(f"no description: {gap}", file=sys.stderr)
    return 1 if gaps or stale else 0


if __name__ == "__main__":
    sys.exit(main())
