"""`kerneld` console entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kerneld import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerneld",
        description="Host daemon that owns a verified store of Kernel Hub kernels and serves "
        "load paths to training processes over gRPC on unix sockets.",
    )
    parser.add_argument("--version", action="version", version=f"kerneld {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    print("kerneld: the daemon's serving loop is not built yet (see issue 5)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
