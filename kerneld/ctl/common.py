"""What every kerneldctl command shares: exit codes, errors, output, opening a store.

Output rules: with `--json` the command prints exactly one JSON document on stdout (progress, if
any, goes nowhere) and human messages go to stderr; without it, humans get tables and lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kerneld.errors import ErrorKind

if TYPE_CHECKING:
    from kerneld.store import StoreHandle

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_STORE_BUSY = 4
#: The daemon runs but this user may not use the socket (or read the key, the store): a fix of
#: group membership, not of the daemon, so scripts must be able to tell it from 3.
EXIT_PERMISSION = 5
#: `gc --target-free N` ran but could not free N bytes (the rest is pinned, leased or in use).
EXIT_GC_TARGET_MISSED = 6
#: `verify` only: its findings are a bitmask (1 corrupt, 2 untrusted, 4 I/O); 8 = could not run.
EXIT_VERIFY_NOT_RUN = 8

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  failure (some kernel failed, a bundle was refused, a check did not match)
  2  usage error (bad arguments)
  3  the daemon is not running or does not answer
  4  --store names a store that a running daemon owns (drop --store to go through it)
  5  permission denied (the socket, store or key file; join kerneld-admin or run as its owner)
  6  gc --target-free: the target could not be reached (the rest is pinned, leased or in use)
  verify: a bitmask of what remains unrepaired, 1 corrupt | 2 untrusted | 4 I/O error;
          8 = could not verify
"""


class CtlError(Exception):
    """A failure with the exit code it maps to and, optionally, a hint for the user."""

    kind = ErrorKind.INTERNAL  # a family: each raise's exit code says more

    def __init__(self, message: str, *, code: int = EXIT_FAILURE, hint: str = "") -> None:
        self.message = message
        self.code = code
        self.hint = hint
        super().__init__(message)


class DaemonNotReachable(CtlError):
    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message, code=EXIT_UNAVAILABLE, hint=hint)


class PermissionDenied(CtlError):
    """The daemon (or file) is there but this user may not use it."""

    kind = ErrorKind.DENIED

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message, code=EXIT_PERMISSION, hint=hint)


@dataclass
class Ctx:
    """The parsed arguments plus output helpers."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO
    emitted: bool = False

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def tty(self) -> bool:
        """Progress bars only when a human watches stdout (and no --json)."""
        try:
            return not self.json and self.out.isatty()
        except (AttributeError, ValueError):
            return False

    def emit_json(self, doc: Any) -> None:
        self.out.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        self.out.flush()
        self.emitted = True

    def say(self, text: str) -> None:
        """A human line on stdout (suppressed with --json)."""
        if not self.json:
            self.out.write(text + "\n")
            self.out.flush()

    def note(self, text: str) -> None:
        """A human line on stderr (kept with --json: it never pollutes the document)."""
        self.err.write(text + "\n")
        self.err.flush()

    def console(self) -> Any:
        from rich.console import Console

        # Not a terminal (a pipe, a log): no width limit to truncate columns to.
        width = None if self.tty else 250
        return Console(file=self.out, highlight=False, soft_wrap=False, width=width)


def human_bytes(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def store_path(ctx: Ctx) -> Path:
    """`--store`, else $KERNELD_STORE / the running daemon's / the default store."""
    explicit = getattr(ctx.args, "store", None)
    if explicit:
        return Path(os.path.abspath(explicit))
    from kerneld_client import locations
    from kerneld_client.errors import UntrustedPath

    try:
        return locations.default_store()
    except UntrustedPath as exc:
        raise CtlError(
            f"refusing the store named by an untrusted advert: {exc}",
            hint="remove the advert if you did not plant it, or name the store with --store",
        ) from exc


#: What to do when the store's files are not this user's to read.
_OWNER_HINT = "run as the store's owner (e.g. runuser -u kerneld -- kerneldctl ...)"


@contextmanager
def open_store(ctx: Ctx, *, writable: bool, create: bool = False) -> Iterator[StoreHandle]:
    """Open the store named by `--store`: read-only (safe beside a running daemon) or as owner.

    Only `create` (a first mirror import on an air-gapped host) may make a new store.
    """
    from kerneld.store import (
        SchemaError,
        StoreError,
        StoreLockedError,
        ToolSettings,
        store_exists,
        store_in_use,
    )
    from kerneld.store import (
        open_store as open_with,
    )

    root = store_path(ctx)
    try:
        exists = store_exists(root)
    except PermissionError as exc:  # a system install's store (0750): not this user's to read
        raise PermissionDenied(
            f"cannot open the store at {root}: {exc.strerror}",
            hint=_OWNER_HINT,
        ) from None
    if not create and not exists:
        raise CtlError(f"no kerneld store at {root}", hint="give the store's path with --store")
    platforms = []
    if writable and store_in_use(root):
        # Before the owner check: its hint (run as the store's owner) would only lead here.
        raise CtlError(
            f"the store at {root} is owned by a running daemon",
            code=EXIT_STORE_BUSY,
            hint="drop --store to go through the daemon, or stop it first",
        )
    if writable:  # republishing the index: with the picks the daemon publishes
        from kerneld.pipeline.prefetch import saved_client_platforms

        platforms = saved_client_platforms(root)
    try:
        store = open_with(ToolSettings(root), read_only=not writable, client_platforms=platforms)
    except StoreLockedError as exc:
        raise CtlError(
            f"the store at {root} is owned by a running daemon ({exc})",
            code=EXIT_STORE_BUSY,
            hint="drop --store to go through the daemon, or stop it first",
        ) from None
    except SchemaError as exc:
        raise CtlError(f"cannot open the store at {root}: {exc}") from None
    except StoreError as exc:
        raise CtlError(f"cannot open the store at {root}: {exc}") from None
    except PermissionError as exc:
        raise PermissionDenied(
            f"cannot open the store at {root}: {exc.strerror}",
            hint=_OWNER_HINT,
        ) from None
    try:
        yield store
    finally:
        store.close()


def offline(ctx: Ctx) -> bool:
    """Whether this invocation works on a store directly (`--store`) instead of the daemon."""
    return bool(getattr(ctx.args, "store", None))


def stdout_ctx(args: argparse.Namespace) -> Ctx:
    return Ctx(args=args, out=sys.stdout, err=sys.stderr)
