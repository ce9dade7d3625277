"""systemd notifications: READY/STATUS/RELOADING/STOPPING and watchdog pings (`Type=notify`).

Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op. The watchdog pings only while a
probe of the daemon's own health succeeds (the store answers a query), so a wedged daemon stops
pinging and systemd restarts it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping

import sdnotify

log = logging.getLogger("kerneld.notify")


class Notifier:
    """Thin wrapper over `sdnotify` that knows whether systemd is listening."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._lock = threading.Lock()
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None

    def send(self, *fields: str) -> None:
        if self._notifier is None:
            return
        with self._lock:
            self._notifier.notify("\n".join(fields))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def reloading(self, status: str) -> None:
        self.send("RELOADING=1", f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between pings (half of `WATCHDOG_USEC`), or None when no watchdog is armed for
    this process (`WATCHDOG_PID`, when set, must be ours)."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
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
