"""`kerneldctl`: administer the host's kerneld daemon and its kernel store.

Commands talk to the daemon over its admin socket (`--admin-socket`, default from
`kerneld_client.locations`), or, with `--store PATH`, work on a store directly (read-only where
possible, so safe beside a running daemon; changes need the daemon stopped). Every command takes
`--json` and documents its exit codes in `--help`.

Each command lives in a `cmd_*.py` module, with the options it takes (its `register`, see
`subcommands.py`); this module holds the options they share, the top-level parser, the list of
command modules and the error handling around a command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kerneld import __version__
from kerneld.ctl import (
    cmd_env,
    cmd_gc,
    cmd_key,
    cmd_lock,
    cmd_ls,
    cmd_mirror,
    cmd_pin,
    cmd_prefetch,
    cmd_publish,
    cmd_reload,
    cmd_status,
    cmd_verify,
)
from kerneld.ctl.common import EXIT_FAILURE, EXIT_USAGE, CtlError, stdout_ctx
from kerneld.ctl.subcommands import FORMATTER, CommandModule, Commands, Handler, epilog

#: Every command module, in the order `kerneldctl --help` lists their commands.
COMMANDS: tuple[CommandModule, ...] = (
    cmd_status,
    cmd_ls,
    cmd_prefetch,
    cmd_pin,
    cmd_gc,
    cmd_verify,
    cmd_reload,
    cmd_lock,
    cmd_mirror,
    cmd_publish,
    cmd_key,
    cmd_env,
)


def _common(*, store: bool = True, socket: bool = True) -> argparse.ArgumentParser:
    """Options every subcommand accepts (so they work after the subcommand name)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    if socket:
        p.add_argument(
            "--admin-socket",
            metavar="PATH",
            help="the daemon's admin socket (default: $KERNELD_ADMIN_SOCKET, else the one that "
            "exists, else /run/kerneld/admin.sock as root or on a system install, else "
            "$XDG_RUNTIME_DIR/kerneld/admin.sock)",
        )
        p.add_argument(
            "--timeout", type=float, metavar="SECONDS", help="deadline of a daemon call (30)"
        )
    if store:
        p.add_argument(
            "--store",
            metavar="PATH",
            help="work on this store directly instead of through the daemon",
        )
    p.add_argument(
        "--config", metavar="FILE", help="kerneld.toml to read (trusted keys, upstreams)"
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerneldctl",
        description="Administer the host's kerneld daemon and its kernel store.",
        formatter_class=FORMATTER,
        epilog=epilog(
            "  kerneldctl status\n"
            "  kerneldctl prefetch kernels-community/activation:1 --variants auto\n"
            "  kerneldctl ls --json\n"
            "  kerneldctl verify --store /var/lib/kerneld/store   (daemon stopped)\n"
            "  kerneldctl mirror export --to /media/usb/kernels.tar --lock kernels.lock "
            "--sign-key site-1\n"
            "  kerneldctl publish . --repo myorg/mykernel --ref v1 --mirror /srv/kernel-mirror\n"
        ),
    )
    parser.add_argument("--version", action="version", version=f"kerneldctl {__version__}")
    commands = Commands(
        sub=parser.add_subparsers(dest="command", metavar="COMMAND"),
        both=_common(),
        store_only=_common(socket=False),
        daemon_only=_common(store=False),
        neither=_common(store=False, socket=False),
    )
    for module in COMMANDS:
        module.register(commands)
    return parser


def _quiet_library_logs() -> None:
    """kerneld's modules log for the daemon's journal; here their outcome is already reported
    by the command, so only errors pass unless $KERNELD_LOG_LEVEL asks for more."""
    import logging

    from kerneld.config.environment import Environment

    level = (Environment.read().log_level or "error").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.ERROR),
        format="kerneldctl: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    ctx = stdout_ctx(args)
    _quiet_library_logs()
    try:
        return handler(ctx)
    except CtlError as exc:
        ctx.note(f"kerneldctl: error: {exc.message}")
        if exc.hint:
            ctx.note(f"kerneldctl: hint: {exc.hint}")
        if ctx.json and not ctx.emitted:
            # --json promises a document on stdout, failures included
            ctx.emit_json(
                {"ok": False, "error": exc.message, "hint": exc.hint, "exit_code": exc.code}
            )
        return exc.code
    except KeyboardInterrupt:
        ctx.note("kerneldctl: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
