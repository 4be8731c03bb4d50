"""What a ``MessageQueue`` (``shard/queue.py``) knows of its log and its backend, and its
accounting; the operations on it live in the modules named for them: ``queue.py`` (in and
out), ``queuespace.py`` (room in the log), ``queuetakeover.py`` (carrying on from a
previous process), ``queueexit.py`` (shutting down).

Counts kept here (the log itself only knows bytes): ``ready`` (READY records in the log),
``live`` (records not DONE). ``take`` walks a delivery cursor over the log; ``finish``
marks a record DONE, and every ``RELEASE_EVERY`` of those the front of the log is released.
Records requeued behind the cursor wait in ``again``, oldest first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pynsqd.shard.backend import Backend, DropBackend
from pynsqd.shard.deferredfiles import DeferredFiles
from pynsqd.shard.refill import Refill
from pynsqd.shard.unit import Tally
from pynsqd.shm.log import DONE, READY, MessageLog
from pynsqd.shm.logrecovery import LogScan
from pynsqd.shm.segment import Segment
from pynsqd.shm.store import ApplyMark

RELEASE_EVERY = 256
MoveHook = Callable[[int, int, int, bytes], None]
Grow = Callable[[MessageLog, int], "int | None"]  # (log, bytes needed) -> index shift, or None


class QueueState:
    """A queue's log, backend, side files, cursor and counts."""

    __slots__ = ("again", "applied", "backend", "cursor", "done_since_release", "files", "grow", "limit", "live", "log",
                 "on_move", "ready", "recovering", "refill", "scan", "segment", "shifted", "tally")

    def __init__(self, log: MessageLog, limit: int, backend: Backend, segment: Segment | None = None,
                 recovering: bool = False, sidecar: str | None = None) -> None:
        self.log = log
        # where deferred messages wait outside the log (durable queues only)
        self.files = None if sidecar is None else DeferredFiles(sidecar)
        self.recovering = recovering  # the owner calls ``start_recovery`` first
        self.scan: LogScan | None = None  # while the log a previous process left is walked
        self.shifted = 0  # how far the log's indices moved back in all (growth), for walkers
        self.again: dict[int, None] = {}  # READY records behind the cursor (requeued in place)
        self.segment = segment
        self.limit = limit
        self.backend = backend
        self.cursor = log.read_index
        self.ready = 0
        self.live = 0
        self.done_since_release = 0
        self.on_move: MoveHook | None = None
        self.grow: Grow | None = None  # makes the log larger (``shm/sizing.Grower``), if it may
        self.refill = Refill(backend, segment)
        # how much of the last cross-shard batch put here it holds (``shard/unit.py``), and the same in the segment
        self.tally = Tally()
        self.applied = None if segment is None or isinstance(backend, DropBackend) else ApplyMark(segment)

    def __len__(self) -> int:
        if self.scan is not None:
            return self.ready + self.scan.unscanned + self.backend.depth
        return self.ready + self.backend.depth

    @property
    def scanning(self) -> bool:
        """True while the log a previous process left is being recovered."""
        return self.scan is not None

    def delivery_end(self) -> int | None:
        """How far delivery and release may go in the log: the scan's cursor while it runs."""
        return None if self.scan is None else self.scan.cursor

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    def requeue(self, pos: int) -> None:
        """Make the (in-flight or deferred) record at ``pos`` ready again, in place."""
        self.log.set_state(pos, READY)
        self.again[pos] = None
        self.ready += 1

    def _pop_again(self, count: int) -> list[int]:
        """Up to ``count`` positions of the records requeued behind the cursor, oldest first."""
        again = self.again
        positions = list(again) if len(again) <= count else list(again)[:count]
        for pos in positions:
            del again[pos]
        return positions

    def took_in(self, count: int) -> None:
        """``count`` READY records were appended to the log by its refill."""
        self.ready += count
        self.live += count

    def finish(self, pos: int) -> None:
        """The record at ``pos`` is done (FIN, sampled out, handed on by a topic)."""
        self.log.states[pos] = DONE
        self._finished(1)

    def finish_many(self, positions: Sequence[int]) -> None:
        """The records at ``positions`` are done (a run of FINs): one state byte each."""
        states = self.log.states
        for pos in positions:
            states[pos] = DONE
        self._finished(len(positions))

    def _finished(self, count: int) -> None:
        """``count`` records were marked DONE; every ``RELEASE_EVERY`` of them the front of
        the log is released."""
        self.live -= count
        self.done_since_release += count
        if self.done_since_release >= RELEASE_EVERY:
            self.done_since_release = 0
            self.log.release(self.delivery_end())

