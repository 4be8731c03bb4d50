"""Exponential back-off with jitter: the one rule for everything in pynsqd that waits longer
after each failure — reconnects (the client library's direct connections, the node's lookupd
registration), shard restarts, a failed destination of the tools, a consumer's RDY backoff,
a shard's failing disk syncs.

The nth consecutive failure waits ``exponential(base, cap, n)`` = ``min(cap, base * 2**(n-1))``
seconds, drawn down by ``jitter``: uniformly from ``[d * (1 - jitter), d]``. Without jitter,
peers that failed together (every node of a cluster when a lookupd restarts, every consumer
when a broker does) retry together, in lockstep, and keep colliding; with it their retries
spread over the interval. A delay is never above ``cap``: callers rely on that bound (lookupd
registration must come back within a ping interval). A success calls ``reset``.
"""

from __future__ import annotations

import random

JITTER = 0.5  # a delay is drawn from its upper half: spread out, and never much shorter


def exponential(base: float, cap: float, n: int) -> float:
    """``min(cap, base * 2 ** (n - 1))`` for the nth failure (0 for n <= 0)."""
    if n <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(n - 1, 62))


class Backoff:
    """Consecutive failures and the delay each one earns (see the module doc)."""

    def __init__(self, base: float, cap: float, jitter: float = JITTER, rng: random.Random | None = None) -> None:
        if base < 0 or cap < 0 or not 0 <= jitter <= 1:
            raise ValueError("back-off durations must be >= 0 and jitter within [0, 1]")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def failed(self) -> float:
        """Count one more failure; the seconds to wait before the next try."""
        self.failures += 1
        delay = exponential(self.base, self.cap, self.failures)
        return delay * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        """A success: the next failure waits ``base`` again."""
        self.failures = 0
