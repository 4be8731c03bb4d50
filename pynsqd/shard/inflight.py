"""Timing state of a channel's messages, with no I/O: in flight, and deferred.

Theory of operation
-------------------
*In flight.* The channel keeps one dict, message id → ``Entry`` (a plain tuple: log
position, consumer, delivery time, deadline, batch), which answers FIN, REQ and TOUCH ("not
in flight" vs "not yours", exactly as nsqd does); a consumer keeps only a count. Deadlines
live in a ``TimeoutWheel`` of slots ``GRANULARITY`` (10 ms) wide. A delivery of up to 256
messages to one consumer shares one deadline, so it goes in as one ``Batch`` — ``[live
count, ids]`` — at the cost of one list append, not 256 heap pushes. FIN does not search the
wheel: it counts its batch down (``settle``), and a batch that reaches 0 drops its ids, so
finished messages hold no memory until their slot comes; an id whose entry is gone or whose
deadline moved on (TOUCH adds it again, as a batch of one, to a later slot) is skipped when
its slot comes due. Delivery and FIN are thus O(1) dict operations, expiry one look per id
still held, batched per scan (nsqd: every 100 ms). A message times out at most one slot
after its deadline, well inside nsqd's own 100 ms scan.

*Deferred.* REQ with a delay and DPUB park messages until a due time. Due times arrive in
any order, so they live in a binary heap ordered by (due, sequence).

Times are integer nanoseconds from ``time.monotonic_ns`` (the caller passes ``now``).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Final

GRANULARITY = 10_000_000  # ns per wheel slot

# One delivery's ids in the wheel: [ids still in flight, ids] (ids emptied at 0).
Batch = list[Any]
# An in-flight message: (log position, consumer, delivered at, deadline, batch); monotonic ns.
Entry = tuple[int, Any, int, int, Batch]
POS: Final = 0
CLIENT: Final = 1
DELIVERED: Final = 2
DEADLINE: Final = 3
BATCH: Final = 4
NO_IDS: list[bytes] = []


def settle(batch: Batch) -> None:
    """One id of ``batch`` left flight (FIN, REQ, TOUCH); the last one frees the ids."""
    batch[0] -= 1
    if not batch[0]:
        batch[1] = NO_IDS


class TimeoutWheel:
    """Ids by coarse deadline. ``add`` a batch of ids due at one time; ``pop_due`` returns
    every id whose slot has come, oldest slot first, possibly including ids that were
    finished or touched since (the caller checks its own table)."""

    __slots__ = ("_granularity", "_heap", "_slots")

    def __init__(self, granularity: int = GRANULARITY) -> None:
        self._granularity = granularity
        self._slots: dict[int, list[Batch]] = {}
        self._heap: list[int] = []  # slot numbers, one entry per slot in ``_slots``

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        """Ids held (for tests: finished batches hold none)."""
        return sum(len(batch[1]) for batches in self._slots.values() for batch in batches)

    def add(self, deadline: int, ids: list[bytes]) -> Batch:
        """Hold ``ids`` (the list itself, not a copy) until ``deadline``; returns their batch,
        which the caller ``settle``s once per id that leaves flight before then."""
        batch: Batch = [len(ids), ids]
        slot = -(-deadline // self._granularity)  # rounded up: never early
        batches = self._slots.get(slot)
        if batches is None:
            self._slots[slot] = [batch]
            heapq.heappush(self._heap, slot)
        else:
            batches.append(batch)
        return batch

    def pop_due(self, now: int) -> list[bytes]:
        """Remove and return the ids of every slot that ended at or before ``now``."""
        heap = self._heap
        limit = now // self._granularity
        out: list[bytes] = []
        while heap and heap[0] <= limit:
            for batch in self._slots.pop(heapq.heappop(heap)):
                out += batch[1]
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

    def drain(self) -> list[tuple[int, bytes]]:
        """Remove and return everything as ``(due, record)``, soonest first."""
        items = sorted(self._heap)
        self._heap.clear()
        return [(due, record) for due, _, record in items]

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None
