"""Two network namespaces joined by a veth pair: a daemon's host and another host on its network.

    with HostPair() as net:                  # skips the test where namespaces cannot be made
        net.run(net.server, ["ip", "addr"])  # a command in one of them, as root
        NetnsDaemon(..., netns=net.server)    # the real daemon in the server's namespace

`server` has `SERVER_ADDR`, `client` `CLIENT_ADDR` (a /30 of the 10.x private range) and each its
own loopback, so a connection from `client` reaches the daemon from a non-loopback address,
as a scraper on another host would, and nothing of this machine's network is touched: both
namespaces (and the veth pair with them) are deleted on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess

SERVER_ADDR = "10.231.77.1"
CLIENT_ADDR = "10.231.77.2"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class HostPair:
    """The two namespaces; a context manager (made on enter, deleted on exit)."""

    def __init__(self) -> None:
        tag = f"kd{os.getpid()}"
        self.server = f"{tag}-srv"
        self.client = f"{tag}-cli"
        self._made: list[str] = []

    def __enter__(self) -> HostPair:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            pytest.skip("network namespaces need root and iproute2's ip")
        for ns in (self.server, self.client):
            made = _ip("netns", "add", ns)
            if made.returncode != 0:
                self.__exit__()
                pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
            self._made.append(ns)
        steps = [
            ("link", "add", "kdv-srv", "netns", self.server, "type", "veth", "peer", "name",
             "kdv-cli", "netns", self.client),
            ("-n", self.server, "addr", "add", f"{SERVER_ADDR}/30", "dev", "kdv-srv"),
            ("-n", self.client, "addr", "add", f"{CLIENT_ADDR}/30", "dev", "kdv-cli"),
            ("-n", self.server, "link", "set", "kdv-srv", "up"),
            ("-n", self.client, "link", "set", "kdv-cli", "up"),
            ("-n", self.server, "link", "set", "lo", "up"),
            ("-n", self.client, "link", "set", "lo", "up"),
        ]  # fmt: skip
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                self.__exit__()
                raise AssertionError(f"ip {' '.join(step)}: {done.stderr.strip()}")
        return self

    def run(
        self, ns: str, argv: Sequence[str], timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """`argv` in namespace `ns`, as root."""
        return subprocess.run(
            ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout
        )

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self._made):
            _ip("netns", "delete", ns)
        self._made.clear()


class NetnsDaemon(DaemonProcess):
    """The real daemon in network namespace `netns`: started as root to enter it (`ip netns
    exec`), it becomes its user (`setpriv`) before Python starts, as the unit's user."""

    def __init__(self, *args: Any, netns: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.netns = netns

    def prepare_user(self) -> dict[str, Any]:
        self._ids = super().prepare_user()
        return {}

    def command(self) -> list[str]:
        inner = super().command()
        ids = getattr(self, "_ids", {})
        switch: list[str] = []
        if ids:
            groups = ",".join(str(g) for g in ids["extra_groups"])
            switch = ["setpriv", f"--reuid={ids['user']}", f"--regid={ids['group']}"]
            switch += [f"--groups={groups}"] if groups else ["--clear-groups"]
            switch.append("--")
        return ["ip", "netns", "exec", self.netns, *switch, *inner]
