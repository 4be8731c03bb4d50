"""Recovering a ``MessageLog`` that a previous process left, a bounded step at a time.

Theory of operation
-------------------
After a kill -9 a queue's log holds every message not yet FINed in the state it had: an
IN_FLIGHT record must become READY again (its attempts kept), a DEFERRED one goes back to
the owner's timers with its due time, a DONE one only waits to be released. One walk over a
log that holds 5,000,000 messages of 200 B (1.3 GB) costs over a second even in C, mostly
the page faults of a fresh mapping, and the walk grows with the backlog. So the owner serves
first and walks while it serves: ``LogScan`` walks from the read index it found up to the
write index it found (``end``), ``step`` records per call (``kernels.recover_run``). Records
appended after ``end`` are this process's own: READY, counted, needing nothing.

Until the scan is done (``MessageQueue`` keeps the rules):

* delivery stops at ``cursor``: records behind it are recovered, and order is kept (the
  records beyond ``end`` wait behind the older ones, as they would have);
* the front is released only up to ``cursor`` (only DONE records, which need nothing), so
  every record the ring's counts covered is walked exactly once and ``recount`` can repair
  those counts at the end without a second walk;
* no live record is moved to the write end (``make_room``) and nothing is read back from the
  backend: neither may touch a record the scan has not seen;
* the queue's depth counts the records not yet walked as ready (``unscanned``: from the
  ring's counts, which a kill -9 can leave one batch too high, so an upper bound).

A log that grows meanwhile (``shm/sizing.Grower``) rebases its indices: ``shift`` moves the
scan's with them.
"""

from __future__ import annotations

from pynsqd.shm.log import MessageLog
from pynsqd.shm.store import Position

Deferred = list[tuple[int, int, bytes]]  # (position, due wall-clock ns, message)


class LogScan:
    """The walk over one log's records after a restart (see the module doc)."""

    __slots__ = ("counted", "cursor", "deferred", "end", "live", "log", "ready", "resume", "walked")

    def __init__(self, log: MessageLog, resume: Position | None = None) -> None:
        self.log = log
        # where the owner's backend resumes reading once the log proved whole (``BackendMark``)
        self.resume = resume
        self.cursor = log.read_index
        self.end = log.write_index
        written, consumed = log.counts()
        self.counted = written - consumed  # what the ring's counts say is queued
        self.walked = 0
        self.ready = 0  # totals so far
        self.live = 0
        self.deferred = 0

    @property
    def done(self) -> bool:
        return self.cursor >= self.end

    @property
    def unscanned(self) -> int:
        """Records not walked yet (an upper bound: the counts may be high after a kill -9)."""
        return 0 if self.done else max(0, self.counted - self.walked)

    def step(self, max_count: int) -> tuple[int, int, Deferred]:
        """Walk up to ``max_count`` more records: (ready ones, live ones, deferred ones).
        When the walk reaches ``end``, the ring's record counts are repaired. ``RingError``
        if a frame is corrupt: the scan stops there."""
        cursor, walked, ready, live, positions = self.log.recover_run(self.cursor, self.end, max_count)
        self.cursor = cursor
        self.walked += walked
        self.ready += ready
        self.live += live
        self.deferred += len(positions)
        if self.done:
            self.log.recount(self.counted - self.walked)
        return ready, live, self.log.deferred_at(positions)

    def shift(self, by: int) -> None:
        """The log's indices moved back by ``by`` (it grew: ``MessageQueue.make_larger``)."""
        self.cursor -= by
        self.end -= by
