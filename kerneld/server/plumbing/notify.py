"""systemd notifications: READY/STATUS/RELOADING/STOPPING and watchdog pings (`Type=notify`).

Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op. The watchdog pings only while a
probe of the daemon's own health succeeds (the store answers a query), so a wedged daemon stops
pinging and systemd restarts it.

The status line (`systemctl status kerneld`) is what the store holds now, then the last event:
"serving 3 trees (...) | config reloaded: no changes". Once `track` is called the store part is
recomputed every few seconds, so a repair, scrub or GC that took trees away shows there instead
of a count from the last start or reload.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import sdnotify

from kerneld.config.environment import Environment

if TYPE_CHECKING:
    from kerneld.store import Status

log = logging.getLogger("kerneld.notify")


class Notifier:
    """Thin wrapper over `sdnotify` that knows whether systemd is listening."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.enabled = bool(Environment.read(env).notify_socket)
        self._lock = threading.Lock()
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        self._summary: Callable[[], str] | None = None
        self._store_part = ""
        self._event = ""
        self._stop_tracking = threading.Event()

    def send(self, *fields: str) -> None:
        if self._notifier is None:
            return
        with self._lock:
            self._notifier.notify("\n".join(fields))

    def line(self) -> str:
        """The status line as sent: the store's state, then the last event."""
        parts = [p for p in (self._store_part, self._event) if p]
        return " | ".join(parts)

    def _status(self, event: str) -> str:
        self._event = "" if event == self._store_part else event
        return f"STATUS={self.line() or event}"

    def ready(self, status: str) -> None:
        self.send("READY=1", self._status(status), f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(self._status(status))

    def reloading(self, status: str) -> None:
        self.send("RELOADING=1", self._status(status))

    def stopping(self, status: str) -> None:
        self._stop_tracking.set()
        self._store_part = ""
        self.send("STOPPING=1", self._status(status))

    def track(self, summary: Callable[[], str], interval: float = 5.0) -> None:
        """Lead the status line with `summary()` (the store now), refreshed every `interval`
        seconds while systemd listens; the event text stays until the next event."""
        self._summary = summary
        self.refresh()
        if self.enabled:
            threading.Thread(
                target=self._track, args=(interval,), name="status-line", daemon=True
            ).start()

    def refresh(self) -> None:
        """Recompute the store part and send the line if it changed."""
        if self._summary is None:
            return
        try:
            part = self._summary()
        except Exception as exc:  # the store is closing: keep the last line
            log.debug("status line not refreshed: %r", exc)
            return
        if part != self._store_part:
            if self._event == part:
                self._event = ""
            self._store_part = part
            self.send(f"STATUS={self.line()}")

    def _track(self, interval: float) -> None:
        while not self._stop_tracking.wait(interval):
            self.refresh()

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")


def store_summary(store: Status, socket: Path) -> str:
    """What the daemon serves, from cheap index queries (runs every few seconds)."""
    usage = store.space.usage()
    trees, used = usage.trees, usage.bytes_used
    line = f"serving {trees} trees ({used} bytes) from {store.root} on {socket}"
    held = store.quarantine.count()
    if held:
        line += f"; {held} quarantined (kerneldctl verify)"
    return line


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between pings (half of `WATCHDOG_USEC`), or None when no watchdog is armed for
    this process (`WATCHDOG_PID`, when set, must be ours)."""
    environment = Environment.read(env)
    usec = environment.watchdog_usec
    if not usec:
        return None
    pid = environment.watchdog_pid
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring invalid WATCHDOG_USEC=%r", usec)
        return None
    return value / 2e6 if value > 0 else None


class Watchdog:
    """Pings systemd every `interval` seconds while `probe()` returns True."""

    def __init__(self, notifier: Notifier, interval: float, probe: Callable[[], bool]) -> None:
        self.notifier = notifier
        self.interval = interval
        self.probe = probe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        log.info("watchdog armed: ping every %.3fs", self.interval)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval):
            try:
                healthy = self.probe()
            except Exception as exc:
                healthy = False
                log.warning("watchdog probe failed: %s", exc)
            if healthy:
                self.notifier.watchdog()
                if failing:
                    log.info("watchdog probe healthy again")
                failing = False
            elif not failing:
                log.error("watchdog probe unhealthy: not pinging systemd")
                failing = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 1)
