"""A daemon with its Hub API endpoint on a loopback port, and its URL."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.support.daemon import DaemonProcess


def hub_api_daemon(
    make_daemon: Callable[..., DaemonProcess], *, config: dict[str, Any] | None = None, **kw: Any
) -> tuple[DaemonProcess, str]:
    """Start a daemon with `[hub_api] listen` on a free loopback port; (daemon, endpoint URL).
    The port is the kernel's choice (port 0), read back from the daemon's log line."""
    cfg = dict(config or {})
    cfg["hub_api"] = {"listen": "127.0.0.1:0", **cfg.get("hub_api", {})}
    daemon = make_daemon(config=cfg, **kw)
    return daemon, endpoint_of(daemon)


def endpoint_of(daemon: DaemonProcess) -> str:
    """The URL the daemon's latest start logged for its Hub API."""
    text = daemon.wait_for_log("hub api on http://")
    urls: list[str] = re.findall(r"hub api on (http://[0-9.:\[\]]+)", text)
    return urls[-1]
