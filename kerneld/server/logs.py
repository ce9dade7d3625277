"""Logging to stderr, one line per event, in the form journald wants when under systemd.

Under systemd (`JOURNAL_STREAM` or `INVOCATION_ID` set) each line starts with a syslog priority
prefix (`<6>`) that journald turns into the entry's priority, and carries no timestamp (journald
adds its own). Elsewhere lines carry a timestamp and the level name. A record's newlines (and a
traceback's) are folded into ` | ` so one event is always one line and one journal entry.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping

_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR


def under_systemd(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


class OneLineFormatter(logging.Formatter):
    """`<6>kerneld.resolve: message` (journald) or `2026-01-01T00:00:00Z INFO kerneld...`."""

    def __init__(self, *, journald: bool) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message += " | " + self.formatException(record.exc_info)
        message = " | ".join(line for line in message.splitlines() if line.strip())
        if self.journald:
            prio = _PRIORITY.get(record.levelno, 6)
            return f"<{prio}>{record.name}: {message}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.name}: {message}"


def setup(level: str, *, env: Mapping[str, str] | None = None) -> None:
    """Route every logger to stderr at `level` (debug/info/warning/error)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(journald=under_systemd(env)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    # Third-party chatter (HTTP clients) stays at warning unless we debug.
    for noisy in ("httpx", "httpx2", "httpcore", "urllib3", "filelock", "huggingface_hub"):
        logger = logging.getLogger(noisy)
        logger.setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
        # A library's own handler (huggingface_hub adds a stderr one at import) would print
        # each of its lines a second time next to ours: one handler, the root's, for all.
        for own in list(logger.handlers):
            logger.removeHandler(own)
        logger.propagate = True


def set_level(level: str) -> None:
    logging.getLogger().setLevel(LEVELS.get(level, logging.INFO))
