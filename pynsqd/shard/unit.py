"""What part of a cross-shard batch a queue holds, so that a batch applied again stores
nothing twice.

Theory of operation
-------------------
The owner applies its inbound rings' records in units (``shard/inbound.py``): one record, or
a run of one ring's plain records for one topic. A ``Unit`` names one by its producer shard
and the time its first record was sent, which is unique in that ring and later than every
record before it. The owner notes the unit in the ring, applies it, then consumes it. A unit
applied but not consumed — one of its queues refused it, or the owner was killed before the
consume — is applied again later from its first message, and a queue that already holds
some of it must skip those.

A unit's ready messages reach a queue in one ``put_many`` (a channel's, or the topic's own
queue while it keeps them), and a deferred one in one call per message, in order; so what a
queue holds of a unit is always its first n messages. ``Tally`` keeps that n, in memory for
the retry after a refusal. For a kill -9, a queue with a segment keeps the same in its name
page (``shm/store.ApplyMark``): before an append of a unit's messages, the count it held and
where its log, its disk queue and (for a deferred message without room) its journal stood;
after it (or after its failure), the count it holds. A restart counts what reached the log,
the disk queue and the journal past those (``MessageQueue.start_recovery``), before it
recovers anything else, so what the restarted owner knows does not wait for its logs' walk.
"""

from __future__ import annotations

from typing import NamedTuple


class Unit(NamedTuple):
    """One call's part of a unit: its messages from ``start`` on."""

    src: int  # the producer shard
    first: int  # CLOCK_MONOTONIC ns its first record was sent
    start: int = 0  # index, among the unit's messages, of the first one of this call


class Tally:
    """The first ``held`` messages of the unit (``src``, ``first``) are in this queue."""

    __slots__ = ("first", "held", "src")

    def __init__(self, src: int = -1, first: int = 0, held: int = 0) -> None:
        self.src = src
        self.first = first
        self.held = held

    def skip(self, unit: Unit, count: int) -> int:
        """How many of the ``count`` messages from ``unit.start`` on are held already."""
        if unit.first != self.first or unit.src != self.src:
            return 0
        return max(0, min(count, self.held - unit.start))

    def took(self, unit: Unit, end: int) -> None:
        """The unit's messages up to ``end`` are held."""
        if unit.first != self.first or unit.src != self.src:
            self.src, self.first, self.held = unit.src, unit.first, end
        elif end > self.held:
            self.held = end
