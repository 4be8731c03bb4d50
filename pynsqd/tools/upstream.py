"""Choosing among several destinations (``--mode`` of nsq_to_http and nsq_to_nsq).

- ``round-robin``: each message goes to the next destination in turn;
- ``hostpool`` / ``epsilon-greedy`` (NSQ's default is hostpool): the first healthy
  destination; one that fails is skipped for a retry interval (30 s doubling up to 15 min,
  go-hostpool's numbers, with jitter: ``pynsqd.backoff``), then tried again;
- ``multicast`` (deprecated in NSQ, still accepted): every message goes to every destination.

Pure state: callers report ``success``/``failure`` with the time and ask ``pick(now)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pynsqd.backoff import Backoff

MODES = ("round-robin", "hostpool", "epsilon-greedy", "multicast")
INITIAL_RETRY = 30.0
MAX_RETRY = 900.0


@dataclass
class _Host:
    address: str
    dead_until: float = 0.0
    retry: Backoff = field(default_factory=lambda: Backoff(INITIAL_RETRY, MAX_RETRY))


class Upstreams:
    def __init__(self, addresses: list[str], mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"invalid mode {mode!r}: use one of {', '.join(MODES)}")
        if not addresses:
            raise ValueError("no destinations")
        self.mode = mode
        self.hosts = [_Host(a) for a in addresses]
        self._next = 0

    def pick(self, now: float) -> list[str]:
        """The destination(s) for the next message."""
        if self.mode == "multicast":
            return [h.address for h in self.hosts]
        if self.mode == "round-robin":
            host = self.hosts[self._next % len(self.hosts)]
            self._next += 1
            return [host.address]
        alive = [h for h in self.hosts if h.dead_until <= now]
        return [(alive[0] if alive else min(self.hosts, key=lambda h: h.dead_until)).address]

    def success(self, address: str) -> None:
        for h in self.hosts:
            if h.address == address:
                h.dead_until = 0.0
                h.retry.reset()

    def failure(self, address: str, now: float) -> None:
        for h in self.hosts:
            if h.address == address:
                h.dead_until = now + h.retry.failed()
