"""Logging to stderr, one line per event, in the form journald wants when under systemd.

Under systemd (`JOURNAL_STREAM` or `INVOCATION_ID` set) each line starts with a syslog priority
prefix (`<6>`) that journald turns into the entry's priority, and carries no timestamp (journald
adds its own). Elsewhere lines carry a timestamp and the level name. A record's newlines (and a
traceback's) are folded into ` | ` so one event is always one line and one journal entry.

Every line is redacted (URL userinfo, Hub tokens: an upstream's credentials must not reach a
journal every admin reads) and cut at `MAX_LINE` characters, so no caller can make one event
cost megabytes of log.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping

from kerneld.config.environment import Environment

_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR

#: journald's own default LineMax is 48 KiB; a traceback fits in this, a flood does not.
MAX_LINE = 16384

_USERINFO = re.compile(r"(?<=//)[^/@\s]*@")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}")


def redact(text: str) -> str:
    """`text` without credentials: URL userinfo (`https://user:token@host` -> `https://host`)
    and Hugging Face tokens (`hf_...` -> `hf_***`)."""
    if "@" in text:
        text = _USERINFO.sub("", text)
    if "hf_" in text:
        text = _HF_TOKEN.sub("hf_***", text)
    return text


def under_systemd(env: Mapping[str, str] | None = None) -> bool:
    return Environment.read(env).under_systemd


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
        message = redact(message)
        if len(message) > MAX_LINE:
            message = f"{message[:MAX_LINE]}... (cut: {len(message)} characters)"
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
