"""What the test Hub records about each request and what it does to it: the request's kind (for
the counters), its record, the faults injected per path pattern and the rate budget.

`HubServer` (tests/support/hubserver.py) holds these; its request handler (hubhandler.py)
consults them on every request.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from typing import Literal

FaultKind = Literal["latency", "error", "rate_limit", "reset", "truncate", "corrupt"]
BODY_FAULTS = frozenset({"reset", "truncate", "corrupt"})

# Request kinds for the counters.
KINDS = (
    "refs",
    "info",
    "tree",
    "paths_info",
    "resolve_head",
    "resolve_get",
    "org_overview",
    "agent_harnesses",
    "other",
)


def request_kind(method: str, raw_path: str) -> str:
    """The counter a request goes to: one of KINDS."""
    parts = raw_path.split("/")
    if raw_path == "/api/agent-harnesses":
        return "agent_harnesses"
    if parts[1:3] == ["api", "organizations"]:
        return "org_overview"
    if parts[1:3] == ["api", "kernels"] and len(parts) >= 5:
        rest = parts[5:]
        if not rest or rest[0] == "revision":
            return "info"
        if rest[0] in ("refs", "tree"):
            return rest[0]
        if rest[0] == "paths-info":
            return "paths_info"
    if parts[1:2] == ["kernels"] and len(parts) >= 7 and parts[4] == "resolve":
        return "resolve_head" if method == "HEAD" else "resolve_get"
    return "other"


@dataclass
class Fault:
    """One injected fault, for requests whose path matches `pattern`: a glob (fnmatch, where `*`
    also matches `/`) or, with `regex=True`, a regex searched in the path. The path is as sent:
    no query string, still percent-encoded (`/api/kernels/o/n/tree/refs%2Fheads%2Fv1`).
    `times=None` fires forever; `fired` counts how often it fired; `method` limits it to one method.

    Kinds: `latency` (sleep `latency_s`, then serve normally; combines with the others), `error`
    (HTTP `status`, default 500), `rate_limit` (429 with `Retry-After: retry_after`), and, on
    responses with a body only (never HEAD): `reset` (half the body, then a TCP RST), `truncate`
    (half the body, then a clean close: Content-Length promised more), `corrupt` (full length, the
    byte at `corrupt_offset` (default: the middle) XOR 0xFF).
    """

    pattern: str
    kind: FaultKind
    times: int | None = None
    latency_s: float = 0.0
    status: int = 500
    retry_after: int = 1
    method: str | None = None
    regex: bool = False
    corrupt_offset: int | None = None
    fired: int = field(default=0, init=False)

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        if self.kind in BODY_FAULTS and method == "HEAD":
            return False
        if self.regex:
            return re.search(self.pattern, path) is not None
        return fnmatch.fnmatchcase(path, self.pattern)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times


@dataclass
class RateBudget:
    """At most `requests` requests per fixed window of `window_s` seconds (the window opens with
    its first request); the rest get 429 with `Retry-After` = the seconds left in the window
    (rounded up). `exclude` kinds (default: the telemetry probe) pass and are not counted."""

    requests: int
    window_s: float
    exclude: tuple[str, ...] = ("agent_harnesses",)
    window_start: float | None = field(default=None, init=False)
    used: int = field(default=0, init=False)
    refused: int = field(default=0, init=False)

    def take(self, kind: str, now: float) -> int | None:
        """None if the request may pass, else the Retry-After seconds to answer with."""
        if kind in self.exclude:
            return None
        if self.window_start is None or now - self.window_start >= self.window_s:
            self.window_start, self.used = now, 0
        if self.used < self.requests:
            self.used += 1
            return None
        self.refused += 1
        return max(1, math.ceil(self.window_start + self.window_s - now))


@dataclass
class RequestRecord:
    """One request, recorded on arrival; `status` is set just before the response is sent, so a
    client always sees its own request counted (0 if no response was sent)."""

    method: str
    path: str
    kind: str
    status: int = 0
    authorization: str = ""  # the Authorization header as sent (tokens reach the Hub only)
    user_agent: str = ""  # the User-Agent header as sent
