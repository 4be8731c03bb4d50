"""RDY arithmetic: how a consumer spreads ``max_in_flight`` over its connections. Pure state.

Theory of operation. nsqd pushes messages to a connection while its in-flight count is below
the last RDY the connection sent; RDY is the consumer's flow control (NSQ's client guide,
"RDY State"). ``RdyBook`` records, per connection, the last RDY sent, the server's
``max_rdy_count``, messages received since that RDY, messages in flight and when the last
message arrived, and answers "what RDY should each connection have now?" under three rules:

1. The sum of the RDY counts never exceeds ``max_in_flight`` and no count exceeds the
   connection's ``max_rdy_count``. Every grant goes through ``set``, which clamps to both.
2. With ``max_in_flight >= connections`` each connection gets ``max_in_flight // n``
   (rounded down: the guarantee wins over using the whole budget). A connection that has not
   received a message yet gets 1, so the first connections made do not take the whole budget
   before discovery finds the rest; it gets its share after its first message.
3. With ``max_in_flight < connections`` some connections must have 0. A connection holding
   RDY that has not received a message for ``low_rdy_idle_timeout`` gives it up, and the
   freed budget goes to connections picked at random among those holding none — so, over
   successive ``rebalance`` calls (every ``rdy_redistribute_interval``), RDY finds the nsqd
   that have messages.

After each message is handled ``wants_update`` says whether to re-send RDY: when the count
the server still allows (last RDY minus messages since) is 0 or below 25% of the last value,
or the connection's share has changed. ``is_starved`` is the guide's test (in flight ≥ 85% of
the last RDY on some connection). No clock, socket or randomness source of its own: callers
pass ``now`` and a ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

STARVED_RATIO = 0.85
LOW_WATER_RATIO = 0.25


@dataclass
class ConnRdy:
    """The RDY state of one connection."""

    max_rdy: int
    rdy: int = 0            # the last RDY sent
    received: int = 0       # messages received since that RDY
    in_flight: int = 0      # messages received and not yet answered (FIN/REQ)
    fresh: bool = True      # no message received yet
    last_active: float = 0.0  # when the last message arrived (or RDY was granted from 0)


class RdyBook:
    """RDY counts of all of a consumer's connections (keys are any hashable connection id)."""

    def __init__(self, max_in_flight: int, low_rdy_idle_timeout: float = 10.0) -> None:
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.max_in_flight = max_in_flight
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.conns: dict[Hashable, ConnRdy] = {}
        self._total = 0  # sum of the conns' rdy, kept as they change (a consumer may hold hundreds)

    # --- membership -------------------------------------------------------------------------
    def add(self, key: Hashable, max_rdy: int, now: float) -> None:
        self.remove(key)
        self.conns[key] = ConnRdy(max_rdy=max(0, max_rdy), last_active=now)

    def remove(self, key: Hashable) -> None:
        conn = self.conns.pop(key, None)
        if conn is not None:
            self._total -= conn.rdy

    @property
    def total(self) -> int:
        """Sum of the RDY counts last sent."""
        return self._total

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in self.conns.values())

    # --- grants -------------------------------------------------------------------------------
    def share(self) -> int:
        """Each connection's RDY when the budget is spread evenly (0 when it cannot be)."""
        n = len(self.conns)
        if n == 0 or self.max_in_flight < n:
            return 0 if n else self.max_in_flight
        return self.max_in_flight // n

    def target(self, key: Hashable) -> int:
        """The RDY ``key`` should hold now under rules 2 and 3 (before the budget clamp)."""
        conn = self.conns[key]
        share = self.share()
        if share == 0:  # rule 3: holders keep 1, others wait for ``rebalance``
            return 1 if conn.rdy > 0 else 0
        return min(1, share) if conn.fresh else share

    def set(self, key: Hashable, count: int, now: float = 0.0) -> int | None:
        """Grant ``count`` to ``key``, clamped by rule 1. Returns the RDY to send, or None
        when nothing needs sending (same value, nothing received since)."""
        conn = self.conns.get(key)
        if conn is None:
            return None
        others = self.total - conn.rdy
        count = max(0, min(count, conn.max_rdy, self.max_in_flight - others))
        if count == conn.rdy and conn.received == 0:
            return None
        if conn.rdy == 0 and count > 0:
            conn.last_active = now
        self._total += count - conn.rdy
        conn.rdy = count
        conn.received = 0
        return count

    def on_message(self, key: Hashable, now: float, count: int = 1) -> None:
        """``count`` messages arrived on ``key`` (a batch counts at once)."""
        conn = self.conns.get(key)
        if conn is not None:
            conn.received += count
            conn.in_flight += count
            conn.fresh = False
            conn.last_active = now

    def on_done(self, key: Hashable, count: int = 1) -> None:
        """``count`` of ``key``'s in-flight messages were answered."""
        conn = self.conns.get(key)
        if conn is not None:
            conn.in_flight = max(0, conn.in_flight - count)

    def wants_update(self, key: Hashable) -> int | None:
        """After a message on ``key`` was answered: the RDY to send now, or None."""
        conn = self.conns.get(key)
        if conn is None:
            return None
        want = self.target(key)
        remaining = conn.rdy - conn.received
        if want != conn.rdy or remaining <= 0 or remaining < LOW_WATER_RATIO * conn.rdy:
            return want
        return None

    def rebalance(self, now: float, rng: random.Random) -> list[tuple[Hashable, int]]:
        """Re-spread the budget over all connections. Returns ``(key, rdy)`` to send, the
        decreases first so the sum nsqd sees never exceeds ``max_in_flight``."""
        changes: list[tuple[Hashable, int]] = []
        if not self.conns:
            return changes
        if self.share() > 0:
            order = sorted(self.conns, key=lambda k: self.target(k) - self.conns[k].rdy)
            for key in order:
                sent = self.set(key, self.target(key), now)
                if sent is not None:
                    changes.append((key, sent))
            return changes
        # rule 3: fewer RDY than connections
        idle = self.idle_holders(now)
        for key in idle:
            if self.set(key, 0, now) is not None:
                changes.append((key, 0))
        available = self.max_in_flight - self.total
        if available <= 0:
            return changes
        waiting = [k for k, c in self.conns.items() if c.rdy == 0 and k not in idle]
        if not waiting:
            waiting = [k for k in idle]
        for key in rng.sample(waiting, min(available, len(waiting))):
            sent = self.set(key, 1, now)
            if sent is not None:
                changes.append((key, sent))
        return changes

    def idle_holders(self, now: float) -> list[Hashable]:
        """Connections holding RDY with nothing in flight and no message for the idle timeout."""
        return [k for k, c in self.conns.items()
                if c.rdy > 0 and c.in_flight == 0 and now - c.last_active >= self.low_rdy_idle_timeout]

    def holders(self) -> list[Hashable]:
        return [k for k, c in self.conns.items() if c.rdy > 0]

    def is_starved(self) -> bool:
        """True when some connection has ≥ 85% of its RDY in flight: time to process a batch."""
        return any(c.in_flight > 0 and c.in_flight >= c.rdy * STARVED_RATIO for c in self.conns.values())
