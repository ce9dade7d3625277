"""What every scenario of `make bench` gets (`Ctx`, with the daemon configuration they share)
and what it returns (a `Section` of RESULTS.md with its `Goal`s)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import base_env
from bench.zygote import Zygote
from examples.kernels.built import BuiltExamples
from tests.support.hubserver import HubServer

# The daemon configuration of every bench daemon: the production thread pool and fetch retries
# (the test defaults retry less), info logging.
DAEMON_CONFIG: dict[str, dict[str, Any]] = {
    "server": {"threads": 16},
    "fetch": {"attempts": 4, "timeout": "10s"},
    "log": {"level": "info"},
}


@dataclass
class Ctx:
    """What every scenario gets: the options, a work directory, the example build, the one
    Hub-compatible server every scenario talks to, and the torch zygote."""

    args: argparse.Namespace
    work: Path
    built: BuiltExamples
    hub_root: Path
    server: HubServer
    zygote: Zygote
    shared: dict[str, Any] = field(default_factory=dict)  # figures one scenario hands another

    @property
    def home(self) -> Path:
        return self.work / "home"

    def base_env(self) -> dict[str, str]:
        return base_env(self.home)


# --- what every scenario returns -------------------------------------------------------------


@dataclass
class Goal:
    text: str
    met: bool | None  # None: not measurable in this run (e.g. scaled down)
    reason: str


@dataclass
class Section:
    """One scenario's part of RESULTS.md."""

    key: str
    title: str
    lines: list[str] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    seconds: float = 0.0
    settings: str = ""
    data: dict[str, Any] = field(default_factory=dict)
