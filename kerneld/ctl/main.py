"""`kerneldctl` console entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kerneld import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerneldctl",
        description="Administer the host's kerneld daemon and its kernel store.",
    )
    parser.add_argument("--version", action="version", version=f"kerneldctl {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
