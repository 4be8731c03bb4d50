"""Timing state of a channel's messages, with no I/O: in flight, and deferred.

Theory of operation
-------------------
*In flight.* A delivered message gets an ``InFlight`` record, kept in two maps: the
channel's (id → record, to answer "not in flight" vs "not yours" exactly as nsqd does) and
the consumer's ``InFlightTable`` (an ``OrderedDict`` in delivery order). Every message a
consumer receives gets the same timeout (its negotiated ``msg_timeout``), so delivery order
*is* deadline order: expiry is a look at the oldest entries, FIN is one ``pop``, and TOUCH
moves an entry to the end (its new deadline, now + timeout, is the latest). That makes every
operation O(1) — no heap, no per-message timer — at 150k messages a second. The one
exception is a TOUCH capped by ``--max-msg-timeout``: its deadline may be earlier than
entries before it, and it then expires when they do (at most one timeout late).

*Deferred.* REQ with a delay and DPUB park messages until a due time. Due times arrive in
any order, so they live in a binary heap ordered by (due, sequence).

Times are integer nanoseconds from ``time.monotonic_ns`` (the caller passes ``now``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Any


class InFlight:
    """One delivery of a message to one consumer."""

    __slots__ = ("attempts", "client", "deadline", "delivered", "pos", "record")

    def __init__(self, record: bytes, client: Any, attempts: int, delivered: int, deadline: int,
                 pos: int = -1) -> None:
        self.record = record        # the encoded message, attempts as stored before delivery
        self.client = client        # the consumer that holds it
        self.attempts = attempts    # attempts including this delivery
        self.delivered = delivered  # monotonic ns of delivery (TOUCH is capped from here)
        self.deadline = deadline    # monotonic ns when it times out
        self.pos = pos              # position of its record in the channel's shared-memory log


class InFlightTable:
    """One consumer's in-flight messages, oldest delivery first."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, InFlight] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, msg_id: bytes, entry: InFlight) -> None:
        self._entries[msg_id] = entry

    def remove(self, msg_id: bytes) -> InFlight | None:
        return self._entries.pop(msg_id, None)

    def touch(self, msg_id: bytes, deadline: int) -> None:
        """Give ``msg_id`` a new deadline (the latest of the table, but for a capped one)."""
        entry = self._entries[msg_id]
        entry.deadline = deadline
        self._entries.move_to_end(msg_id)

    def expired(self, now: int) -> list[tuple[bytes, InFlight]]:
        """Remove and return the entries whose deadline has passed, oldest first."""
        out: list[tuple[bytes, InFlight]] = []
        entries = self._entries
        while entries:
            msg_id, entry = next(iter(entries.items()))
            if entry.deadline > now:
                break
            entries.popitem(last=False)
            out.append((msg_id, entry))
        return out

    def drain(self) -> list[tuple[bytes, InFlight]]:
        """Remove and return every entry (the consumer went away)."""
        out = list(self._entries.items())
        self._entries.clear()
        return out

    def next_deadline(self) -> int | None:
        if not self._entries:
            return None
        return next(iter(self._entries.values())).deadline


class DeferredQueue:
    """Messages waiting for a due time, soonest first."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, bytes]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due: int, record: bytes) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), record))

    def pop_due(self, now: int) -> list[bytes]:
        """Remove and return the records due at or before ``now``, soonest first."""
        heap = self._heap
        out: list[bytes] = []
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        return out

    def drain(self) -> list[tuple[int, bytes]]:
        """Remove and return everything as ``(due, record)``, soonest first."""
        items = sorted(self._heap)
        self._heap.clear()
        return [(due, record) for due, _, record in items]

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None
