"""The faulty Hub: the project's Hub-compatible test server with random faults at a rate.

`tests.support.hubserver.HubServer` injects faults per path pattern, deterministically; a soak
test wants them at random, at a rate, with a mix that changes over time. `ChaosHub` adds that in
`_take_faults` (one random draw per request) and counts what it injected and how many file bytes
it served (to report bytes re-fetched). `FaultPhases` is the injector thread that moves between
phases: calm, flaky (the configured rate, every kind), slow (latency) and outage (every request
fails), so the daemon sees both scattered faults and the Hub being down for a while.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tests.support.hubhandler import HubHandler
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import BODY_FAULTS, Fault, FaultKind

ALL_KINDS: dict[FaultKind, float] = {
    "latency": 3.0,
    "error": 2.0,
    "rate_limit": 1.0,
    "reset": 1.0,
    "truncate": 1.0,
    "corrupt": 2.0,
}


@dataclass(frozen=True)
class Phase:
    name: str
    rate: float
    mix: Mapping[FaultKind, float]


class _CountingHandler(HubHandler):
    """Counts the body bytes of file downloads as they leave (after truncation faults)."""

    def _send(
        self, status: int, body: bytes, headers: Mapping[str, str], *, head: bool = False
    ) -> None:
        if not head and body and self._record.kind == "resolve_get" and 200 <= status < 300:
            fault = self._fault
            sent = (
                len(body) // 2
                if fault is not None and fault.kind in ("reset", "truncate")
                else len(body)
            )
            agent = self.headers.get("User-Agent") or ""
            who = "daemon" if agent.startswith("kerneld/") else "client"
            cast("ChaosHub", self.server.hub).count_file_bytes(self._record.path, sent, who)
        super()._send(status, body, headers, head=head)


class ChaosHub(HubServer):
    """HubServer plus a random fault per request with probability `rate`, drawn from `mix`."""

    def __init__(
        self,
        root: Path | str,
        *,
        trusted_orgs: Mapping[str, bool],
        seed: int,
        max_latency_s: float = 3.0,
    ) -> None:
        super().__init__(root, trusted_orgs=trusted_orgs)
        self._rng = random.Random(seed)
        self._chaos_lock = threading.Lock()
        self.phase = Phase("calm", 0.0, {})
        self.max_latency_s = max_latency_s
        self.injected: Counter[str] = Counter()
        self.file_bytes: Counter[tuple[str, str]] = Counter()
        """(request path, who) -> body bytes sent; who is `daemon` or `client`."""

    def start(self) -> ChaosHub:
        super().start()
        assert self._httpd is not None
        self._httpd.RequestHandlerClass = _CountingHandler  # before any client knows the URL
        return self

    def set_phase(self, phase: Phase) -> None:
        with self._chaos_lock:
            self.phase = phase

    def count_file_bytes(self, path: str, n: int, who: str) -> None:
        with self._chaos_lock:
            self.file_bytes[(path, who)] += n

    def _take_faults(
        self, method: str, path: str, *args: Any, **kwargs: Any
    ) -> tuple[float, Fault | None]:
        delay, chosen = super()._take_faults(method, path, *args, **kwargs)
        with self._chaos_lock:
            phase = self.phase
            if phase.rate <= 0 or self._rng.random() >= phase.rate:
                return delay, chosen
            kinds = [k for k in phase.mix if not (k in BODY_FAULTS and method == "HEAD")]
            if not kinds:
                return delay, chosen
            kind = self._rng.choices(kinds, weights=[phase.mix[k] for k in kinds])[0]
            self.injected[kind] += 1
            if kind == "latency":
                return delay + self._rng.uniform(0.05, self.max_latency_s), chosen
            fault = Fault(
                pattern="*",
                kind=kind,
                status=self._rng.choice((500, 502, 503)),
                retry_after=self._rng.choice((0, 1, 2)),
            )
        fault.fired = 1
        return delay, chosen or fault


class FaultPhases(threading.Thread):
    """Moves the hub between phases every `period_s` (the rate and mix change over the run)."""

    def __init__(self, hub: ChaosHub, *, rate: float, period_s: float, seed: int) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.hub = hub
        self.period_s = period_s
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.phases = [
            (Phase("flaky", rate, ALL_KINDS), 5.0),
            (Phase("calm", 0.0, {}), 1.5),
            (Phase("slow", min(1.0, 3 * rate), {"latency": 1.0}), 1.5),
            (Phase("outage", 1.0, {"error": 2.0, "rate_limit": 1.0, "reset": 1.0}), 1.0),
        ]
        self.seconds: dict[str, float] = defaultdict(float)
        self.timeline: list[tuple[float, str]] = []
        """(wall-clock start, phase name) of every phase, in order: loads are attributed to the
        phase they started in."""

    def run(self) -> None:
        while not self.stop_event.is_set():
            phase = self.rng.choices([p for p, _ in self.phases], [w for _, w in self.phases])[0]
            # An outage is short: long enough to matter, short enough that work goes on.
            span = self.period_s * (0.5 if phase.name == "outage" else self.rng.uniform(0.5, 1.5))
            self.hub.set_phase(phase)
            self.timeline.append((time.time(), phase.name))
            t0 = time.monotonic()
            self.stop_event.wait(span)
            self.seconds[phase.name] += time.monotonic() - t0
        self.hub.set_phase(Phase("calm", 0.0, {}))
        self.timeline.append((time.time(), "calm"))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
