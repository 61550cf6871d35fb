"""When the client sends a request again, and how long it waits first: a pure, bounded policy.

What is retried (both clients, JSON calls and codec streams alike):

* a 429 (``overloaded``) or 503 (engine starting, codec unavailable, a replica going down) answer,
  after the server's ``Retry-After`` when it gives one, else after an exponential backoff;
* a connection that failed before any byte of the answer arrived: refused, reset, or closed while
  the request was going out. A streamed upload is sent again only when its source can be replayed
  (bytes, a seekable file, or nothing of it read yet).

Nothing is retried once the answer has started: a codec stream cut half-way already wrote part of
its output, so the client reports the cut (no ``done`` event) instead. Every Cascade request is
free of side effects and the codec and greedy ones are deterministic, so sending one again, even to
another replica, is safe. The budget is bounded twice, in attempts and in seconds; the error that
ends it says how many attempts were made.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a request gets and how long they may take in all.

    ``attempts`` counts the first try (1 = never retry). A wait never pushes the total past
    ``budget_seconds``: when the server's ``Retry-After`` or the next backoff would, the client gives
    up at once. ``max_retry_after`` caps what a server may ask for per wait.
    """

    attempts: int = 5
    budget_seconds: float = 60.0
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    max_retry_after: float = 30.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1 (1: no retries)")
        if not all(math.isfinite(v) and v >= 0 for v in (self.budget_seconds, self.backoff_seconds,
                                                          self.max_backoff_seconds, self.max_retry_after)):
            raise ValueError("retry budget, backoff and Retry-After cap must be finite and not negative")

    @classmethod
    def none(cls) -> RetryPolicy:
        """One attempt: every failure is raised as it happens."""
        return cls(attempts=1)

    def backoff(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """The wait after the ``failures``-th failure when the server named none: exponential,
        capped, and with jitter (half to all of it) so clients that failed together spread out."""
        base = min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (failures - 1))
        return base * (0.5 + 0.5 * rand()) if self.jitter else base

    def start(self, clock: Callable[[], float] = time.monotonic) -> Attempts:
        return Attempts(self, clock)


@dataclass
class Attempts:
    """The attempts of one request: ``wait`` after each retryable failure says how long to sleep
    before the next one, or ``None`` when the budget is spent (the caller then raises, with
    ``summary`` in its message)."""

    policy: RetryPolicy
    clock: Callable[[], float] = time.monotonic
    made: int = 1
    started: float = field(default=-1.0)
    rand: Callable[[], float] = random.random

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    def wait(self, retry_after: float | None = None) -> float | None:
        """Seconds to sleep before attempt ``made + 1`` (and count it), or ``None`` to give up."""
        if self.made >= self.policy.attempts:
            return None
        if retry_after is not None:
            if retry_after > self.policy.max_retry_after:
                return None
            delay = retry_after
        else:
            delay = self.policy.backoff(self.made, self.rand)
        if self.clock() - self.started + delay > self.policy.budget_seconds:
            return None
        self.made += 1
        return delay

    def summary(self) -> str:
        elapsed = self.clock() - self.started
        return f"gave up after {self.made} attempt{'s' if self.made != 1 else ''} in {elapsed:.1f} s"


def retry_after_seconds(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; ``None`` when absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now())
