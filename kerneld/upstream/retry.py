"""Retries with exponential backoff, full jitter and `Retry-After`, for every upstream call.

Every call is bounded twice: by a number of attempts and by a total time budget (attempts,
their timeouts and the waits between them together). A host that cannot be reached at all (DNS
failure, connection refused) is given up on after `unreachable_attempts`: such failures come
back in milliseconds and rarely heal within the next second, so more tries only make a job wait.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kerneld.errors import ErrorKind
from kerneld.upstream.errors import UpstreamUnavailable

T = TypeVar("T")
log = logging.getLogger("kerneld.upstream.retry")

#: (deadline, request timeout) of the upstream call running in this context (None outside one):
#: the monotonic time by which it must end and its policy's timeout. HTTP clients read it through
#: `request_timeout`, so that no single request (to a server that accepts and never answers,
#: say) outlives the call's budget.
_current: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "kerneld_upstream_call", default=None
)
#: The shortest timeout a request is given, even at the very end of a budget.
MIN_REQUEST_TIMEOUT = 0.05

_recent_lock = threading.Lock()
_recent: dict[str, tuple[float, str]] = {}


class TransientError(Exception):
    """A failure worth retrying: connection trouble, 5xx, 429. Carries Retry-After if any.

    `unreachable` marks failures that say the host cannot be reached at all (name resolution,
    connection refused): retried at most `RetryPolicy.unreachable_attempts` times.
    """

    kind = ErrorKind.INTERNAL  # retried, then raised as UpstreamUnavailable

    def __init__(
        self, message: str, *, retry_after: float | None = None, unreachable: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unreachable = unreachable


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Defaults suit a daemon: a few quick tries, never minutes of waiting."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0
    #: A server asking for a longer wait than this is treated as unavailable now.
    max_retry_after: float = 30.0
    #: Seconds one request may take (connect, and each read).
    timeout: float = 10.0
    #: Seconds one call may take in all, attempts and waits together (None: 3 timeouts, and
    #: at least 30 s).
    budget: float | None = None
    #: Attempts when the host cannot be reached at all (DNS failure, connection refused).
    unreachable_attempts: int = 2

    @property
    def total(self) -> float:
        """The call's time budget in seconds."""
        return self.budget if self.budget is not None else max(30.0, 3 * self.timeout)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        # Full jitter (AWS architecture blog): spreads many ranks/daemons apart.
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))  # noqa: S311


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delay-seconds form; HTTP dates are ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def request_timeout(default: float) -> float:
    """The timeout for one request: the running call's policy timeout (else `default`), cut to
    what is left of the call's budget."""
    current = _current.get()
    if current is None:
        return default
    deadline, timeout = current
    return max(MIN_REQUEST_TIMEOUT, min(timeout, deadline - time.monotonic()))


def in_upstream_call() -> bool:
    """True inside `with_retries`: HTTP errors must surface to it rather than be retried below."""
    return _current.get() is not None


def note_failure(upstream: str, message: str) -> None:
    """Remember an upstream's latest failed attempt, for answers given while it is retried."""
    if upstream:
        with _recent_lock:
            _recent[upstream] = (time.monotonic(), message)


def recent_failure(upstream: str, since: float) -> str | None:
    """The latest failed attempt of `upstream` at or after monotonic time `since`, if any."""
    with _recent_lock:
        entry = _recent.get(upstream)
    if entry is None or entry[0] < since:
        return None
    return entry[1]


def with_retries(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    what: str,
    upstream: str = "",
    repo_id: str = "",
    revision: str = "",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn`, retrying on `TransientError` within the policy's attempts and time budget;
    give up with `UpstreamUnavailable`."""
    start = time.monotonic()
    deadline = start + policy.total
    outer = _current.get()
    token = _current.set((deadline if outer is None else min(deadline, outer[0]), policy.timeout))
    last: TransientError | None = None
    tries = 0
    why = ""
    try:
        for attempt in range(policy.attempts):
            tries = attempt + 1
            try:
                return fn()
            except TransientError as exc:
                last = exc
                note_failure(upstream, str(exc))
            if last.retry_after is not None and last.retry_after > policy.max_retry_after:
                why = f"; it asked to wait {last.retry_after:.0f}s"
                break
            if last.unreachable and tries >= policy.unreachable_attempts:
                why = "; the host cannot be reached"
                break
            if tries >= policy.attempts:
                break
            wait = policy.delay(attempt, last.retry_after)
            if time.monotonic() + wait >= deadline:
                why = f"; out of its {policy.total:g}s budget"
                break
            log.info(
                "retrying upstream=%s repo=%s rev=%s what=%s attempt=%d wait=%.2fs error=%s",
                upstream,
                repo_id,
                revision,
                what,
                tries,
                wait,
                last,
            )
            sleep(wait)
    finally:
        _current.reset(token)
    elapsed = time.monotonic() - start
    plural = "s" if tries != 1 else ""
    raise UpstreamUnavailable(
        f"{what} failed after {tries} attempt{plural} in {elapsed:.1f}s{why}: {last}",
        upstream=upstream,
        repo_id=repo_id,
        revision=revision,
    ) from last
