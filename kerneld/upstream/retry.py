"""Retries with exponential backoff, full jitter and `Retry-After`, for every upstream call."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kerneld.upstream.errors import UpstreamUnavailable

T = TypeVar("T")
log = logging.getLogger("kerneld.upstream.retry")


class TransientError(Exception):
    """A failure worth retrying: connection trouble, 5xx, 429. Carries Retry-After if any."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Defaults suit a daemon: a few quick tries, never minutes of waiting."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0
    #: A server asking for a longer wait than this is treated as unavailable now.
    max_retry_after: float = 30.0
    timeout: float = 10.0

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
    """Call `fn`, retrying on `TransientError`; give up with `UpstreamUnavailable`."""
    last: TransientError | None = None
    for attempt in range(policy.attempts):
        try:
            return fn()
        except TransientError as exc:
            last = exc
            if exc.retry_after is not None and exc.retry_after > policy.max_retry_after:
                break
            if attempt + 1 < policy.attempts:
                wait = policy.delay(attempt, exc.retry_after)
                log.info(
                    "retrying upstream=%s repo=%s rev=%s what=%s attempt=%d wait=%.2fs error=%s",
                    upstream,
                    repo_id,
                    revision,
                    what,
                    attempt + 1,
                    wait,
                    exc,
                )
                sleep(wait)
    raise UpstreamUnavailable(
        f"{what} failed after {policy.attempts} attempts: {last}",
        upstream=upstream,
        repo_id=repo_id,
        revision=revision,
    ) from last
