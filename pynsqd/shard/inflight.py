"""Timing state of a channel's messages, with no I/O: in flight, and deferred.

Theory of operation
-------------------
*In flight.* A delivery of up to 256 messages to one consumer is one ``Delivery``: the
consumer, the delivery time, the deadline (every message a consumer receives gets its
negotiated ``msg_timeout``), its ids and how many of them are still in flight. The channel
keeps two dicts keyed by message id, filled in C for a whole delivery
(``dict.fromkeys(ids, delivery)``, ``zip(ids, positions)``): id → ``Delivery`` (answers FIN,
REQ and TOUCH: "not in flight" vs "not yours", exactly as nsqd does) and id → log position.
No object is made per message, so the garbage collector has nothing new to track.

Deadlines live in a ``TimeoutWheel`` of slots ``GRANULARITY`` (10 ms) wide: a delivery goes
in with one list append, not 256 heap pushes. FIN does not search the wheel: it counts its
delivery down (``settle``), and a delivery that reaches 0 drops its ids, so finished messages
hold no memory until their slot comes. An id whose entry is gone, or belongs to another
delivery now (TOUCH moves the id to a new delivery of one, with a later deadline), is skipped
when its slot comes due. Delivery and FIN are thus O(1) dict operations, expiry one look per
id still held, batched per scan (nsqd: every 100 ms). A message times out at most one slot
after its deadline, well inside nsqd's own 100 ms scan.

*Deferred.* REQ with a delay and DPUB park messages until a due time. Due times arrive in
any order, so they live in a binary heap ordered by (due, sequence).

Times are integer nanoseconds from ``time.monotonic_ns`` (the caller passes ``now``).
"""

from __future__ import annotations

import heapq
import itertools

from pynsqd.shard.subscriber import Subscriber

GRANULARITY = 10_000_000  # ns per wheel slot
NO_IDS: list[bytes] = []


class Delivery:
    """Messages handed to one consumer at once, sharing a deadline."""

    __slots__ = ("client", "deadline", "delivered", "ids", "live")

    def __init__(self, ids: list[bytes], client: Subscriber, delivered: int, deadline: int) -> None:
        self.ids = ids              # their message ids (NO_IDS once none is in flight)
        self.live = len(ids)        # how many of them are still in flight
        self.client = client        # the consumer that holds them
        self.delivered = delivered  # monotonic ns of delivery (TOUCH is capped from here)
        self.deadline = deadline    # monotonic ns when they time out

    def settle(self) -> None:
        """One of the ids left flight (FIN, REQ, TOUCH); the last one frees the ids."""
        self.live -= 1
        if not self.live:
            self.ids = NO_IDS


class TimeoutWheel:
    """Deliveries by coarse deadline. ``pop_due`` returns the ids of every delivery whose
    slot has come, oldest slot first, possibly including ids that were finished or moved
    since (the caller checks its own table)."""

    __slots__ = ("_granularity", "_heap", "_slots")

    def __init__(self, granularity: int = GRANULARITY) -> None:
        self._granularity = granularity
        self._slots: dict[int, list[Delivery]] = {}
        self._heap: list[int] = []  # slot numbers, one entry per slot in ``_slots``

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        """Ids held (settled deliveries hold none)."""
        return sum(len(d.ids) for deliveries in self._slots.values() for d in deliveries)

    def add(self, delivery: Delivery) -> None:
        """Hold ``delivery`` until its deadline."""
        slot = -(-delivery.deadline // self._granularity)  # rounded up: never early
        deliveries = self._slots.get(slot)
        if deliveries is None:
            self._slots[slot] = [delivery]
            heapq.heappush(self._heap, slot)
        else:
            deliveries.append(delivery)

    def pop_due(self, now: int) -> list[bytes]:
        """Remove the deliveries of every slot that ended at or before ``now``; their ids."""
        heap = self._heap
        limit = now // self._granularity
        out: list[bytes] = []
        while heap and heap[0] <= limit:
            for delivery in self._slots.pop(heapq.heappop(heap)):
                out += delivery.ids
        return out

    def next_due(self) -> int | None:
        """When the first slot comes due (ns), or None when empty."""
        return self._heap[0] * self._granularity if self._heap else None

    def clear(self) -> None:
        self._slots.clear()
        self._heap.clear()


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

    def items(self) -> list[tuple[int, bytes]]:
        """Everything as ``(due, record)``, soonest first, kept."""
        return [(due, record) for due, _, record in sorted(self._heap)]

    def drain(self) -> list[tuple[int, bytes]]:
        """Remove and return everything as ``(due, record)``, soonest first."""
        items = sorted(self._heap)
        self._heap.clear()
        return [(due, record) for due, _, record in items]

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None
