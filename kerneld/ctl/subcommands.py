"""How a command module adds its `kerneldctl` subcommands: `register(commands)`.

Each `kerneld/ctl/cmd_*.py` module defines `register(commands: Commands) -> None`, which adds its
subcommands with their options and `set_defaults(handler=<the command function>)`, so the
parser, the import graph and a reader all see which function runs which command. `main.py`
builds the top-level parser and the shared option sets, and lists the modules.

`kerneldctl --help` imports every command module, so a command module imports only the standard
library, `kerneld.ctl.common` and this at load time; what a command needs to run (the RPC
channel, the store, the client's lock file reader) it imports inside its function.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from kerneld.ctl.common import EXIT_CODES_HELP, Ctx

#: What a subcommand runs: its exit status from the parsed command line.
Handler = Callable[[Ctx], int]
FORMATTER = argparse.RawDescriptionHelpFormatter
if TYPE_CHECKING:  # generic in typeshed only
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def epilog(examples: str) -> str:
    """Every help page ends with examples and the exit codes."""
    return "examples:\n" + examples.rstrip() + "\n\n" + EXIT_CODES_HELP


@dataclass(frozen=True)
class Commands:
    """Where commands go, with the shared option sets (`main._common`) they take as parents."""

    sub: Subparsers
    both: argparse.ArgumentParser
    """--json, --admin-socket, --timeout, --store, --config: through the daemon or a store."""
    store_only: argparse.ArgumentParser
    """--json, --store, --config: reads a store, never the daemon."""
    daemon_only: argparse.ArgumentParser
    """--json, --admin-socket, --timeout, --config: the daemon only."""
    neither: argparse.ArgumentParser
    """--json, --config: a command that names its own target."""

    def add(
        self,
        name: str,
        handler: Handler,
        help_: str,
        examples: str,
        *parents: argparse.ArgumentParser,
    ) -> argparse.ArgumentParser:
        """A subcommand whose description is its help line (the shared options by default)."""
        p: argparse.ArgumentParser = self.sub.add_parser(
            name,
            parents=list(parents) or [self.both],
            help=help_,
            description=help_,
            epilog=epilog(examples),
            formatter_class=FORMATTER,
        )
        p.set_defaults(handler=handler)
        return p

    def group(
        self, name: str, help_: str, description: str, examples: str, *, dest: str, metavar: str
    ) -> Subparsers:
        """A subcommand that only holds subcommands (`mirror export`, `key generate`)."""
        parser = self.sub.add_parser(
            name,
            help=help_,
            description=description,
            formatter_class=FORMATTER,
            epilog=epilog(examples),
        )
        group: Subparsers = parser.add_subparsers(dest=dest, metavar=metavar, required=True)
        return group


class CommandModule(Protocol):
    """A `kerneld/ctl/cmd_*.py` module, as `main.py` lists them."""

    def register(self, commands: Commands) -> None: ...
