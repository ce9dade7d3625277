"""kerneldctl's commands are where the parser says: each `kerneld/ctl/cmd_*.py` module is listed
in `main.COMMANDS` and adds its subcommands with the function that runs them, and building the
parser (what `kerneldctl --help` does) loads none of what the commands need to run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kerneld.ctl.main import COMMANDS, build_parser

CTL = Path(__file__).resolve().parents[2] / "kerneld" / "ctl"

#: What `build_parser()` may load of kerneld: the package, the parser, the command modules.
PARSER_MODULES = {"kerneld", "kerneld.ctl", "kerneld.ctl.main", "kerneld.ctl.common"}
PARSER_MODULES |= {"kerneld.ctl.subcommands"} | {m.__name__ for m in COMMANDS}
#: kerneldctl's errors declare their kind (issue 54): the error vocabulary imports only `enum`.
PARSER_MODULES |= {"kerneld.errors"}


def _leaves(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable subcommand ("status", "mirror export", ...) and its parser."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _leaves(sub, f"{path} {name}".strip())
    if not found and path:
        found[path] = parser
    return found


def test_every_command_module_is_listed_and_runs_its_own_functions() -> None:
    on_disk = {f"kerneld.ctl.{p.stem}" for p in CTL.glob("cmd_*.py")}
    assert {m.__name__ for m in COMMANDS} == on_disk
    leaves = _leaves(build_parser())
    assert len(leaves) == 18, sorted(leaves)
    for name, parser in leaves.items():
        handler = parser.get_default("handler")
        assert callable(handler), f"{name}: handler {handler!r}"
        assert handler.__module__ in on_disk, f"{name}: {handler.__module__}.{handler.__name__}"
        assert handler.__name__.startswith("cmd_"), f"{name}: {handler.__name__}"


def _kerneld_modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    return {m for m in loaded if m.split(".")[0] in ("kerneld", "kerneld_client", "grpc", "rich")}


def test_building_the_parser_loads_no_command_dependencies() -> None:
    """The command modules import what they run on inside their functions, so `--help` pays
    for the parser only (the RPC channel alone would pull in the config)."""
    loaded = _kerneld_modules_after("from kerneld.ctl.main import build_parser; build_parser()")
    assert loaded - PARSER_MODULES == set()
    # the probe sees a command's dependency when one is imported
    loaded = _kerneld_modules_after("import kerneld.ctl.main, kerneld.ctl.rpc")
    assert {"kerneld.ctl.rpc", "kerneld.config"} <= loaded - PARSER_MODULES


def test_a_command_over_the_sockets_does_not_import_the_store() -> None:
    """A command that asks the daemon (`ls`, `status`, `gc`, ...) reads the settings and talks
    gRPC; the store package is the daemon's (and the offline commands'). Importing it from the
    settings cost every such command 0.1 s of CPU, more than its gRPC channel."""
    loaded = _kerneld_modules_after(
        "import kerneld.ctl.main, kerneld.ctl.rpc, kerneld.config; kerneld.config.load_config"
    )
    assert not {m for m in loaded if m == "kerneld.store" or m.startswith("kerneld.store.")}
    # the probe sees the store when a command imports it
    assert "kerneld.store" in _kerneld_modules_after("import kerneld.ctl.rpc, kerneld.store")
